"""``--chaos`` on the rank side: a cell's task run so that one process of the world is lost
the moment it enters a named phase (conformance/rank/progress.py), as ranks are lost in the
field: killed (the OOM killer, a preempted node) or stopped (a hung driver). Which cell,
process and phase is the front end's seeded choice (conformance/frontend/chaos.py)."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from conformance.rank import inner, progress

SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def lose(fn: str, kwargs: dict[str, Any], process: int, phase: str, how: str) -> Any:
    """Run the task ``fn(**kwargs)``; the world's process ``process`` (its RANK, which in a
    simulated world is the process's index, not the rank it acts as) is lost entering ``phase``."""
    armed = progress.lost_at(phase, SIGNALS[how]) if int(os.environ["RANK"]) == process else contextlib.nullcontext()
    with armed:
        return inner.call(fn, kwargs)

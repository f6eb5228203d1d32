"""``--chaos`` on the rank side: a cell's task run so that one process of the world is lost
the moment it enters a named phase (conformance/rank/progress.py), as ranks are lost in the
field: killed (the OOM killer, a preempted node) or stopped (a hung driver). Which cell,
process and phase is the front end's seeded choice (conformance/frontend/chaos.py)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from typing import Any

from conformance.rank import inner, progress
from conformance.world import protocol


def _node_dies() -> None:
    """This rank's machine goes: its join agent, its torchrun, then itself, each SIGKILLed (its
    agent first, so that nothing is left to report the others' deaths)."""
    for pid in (int(os.environ[protocol.ENV_AGENT]), os.getppid(), os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# how a process is lost: killed, stopped, or with the whole node it runs on (another node's
# rank only: the controller's node is the run itself)
HOW: dict[str, Callable[[], None]] = {
    "kill": lambda: os.kill(os.getpid(), signal.SIGKILL),
    "stop": lambda: os.kill(os.getpid(), signal.SIGSTOP),
    "node": _node_dies,
}


def loses(process: int, how: str) -> bool:
    """Whether this process is the world's process ``process`` that is lost (its RANK, which in
    a simulated world is the process's index, not the rank it acts as). A node is another
    machine's: the first process of the first agent's node (the kit's node 1) stands for it,
    whatever RANK the rendezvous gave it (torchrun orders the nodes by their descriptors, not
    by who hosts the store: the controller's node may hold rank 1)."""
    if how == "node":
        return os.environ.get(protocol.ENV_NODE) == "1" and os.environ.get("LOCAL_RANK") == "0"
    return int(os.environ["RANK"]) == process


def lose(fn: str, kwargs: dict[str, Any], process: int, phase: str, how: str) -> Any:
    """Run the task ``fn(**kwargs)``; the world's process ``process`` (``loses``) is lost
    entering ``phase``."""
    armed = progress.lost_at(phase, HOW[how]) if loses(process, how) else contextlib.nullcontext()
    with armed:
        return inner.call(fn, kwargs)

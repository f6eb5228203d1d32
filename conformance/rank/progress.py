"""Where this rank is in its task, for the controller's account of a rank that died or hung
("rank 1: died ... during training / step 1 (SGD) / backward").

The rank side names its phases here; each change is written to the file the rank loop names
in ``$CONFORMANCE_PHASE_FILE`` (``conformance.world.protocol.ENV_PHASE``), which the
controller reads when a rank cannot answer. A file rather than the control store: a write
costs microseconds and no round trip, and it outlives the process that wrote it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

ENV = "CONFORMANCE_PHASE_FILE"

_stack: list[str] = []
# --chaos (and the kit's own fault tests): the phase, or part of its name, at whose entry this
# rank is lost, and the signal that loses it (conformance/rank/chaos.py arms it for one task)
_lost_at: tuple[str, signal.Signals] | None = None


def at(name: str) -> None:
    """The task's next top-level phase (what came before it has ended)."""
    _stack[:] = [name]
    _write()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """A phase inside the current one, for the block."""
    _stack.append(name)
    _write()
    try:
        yield
    finally:
        _stack.pop()
        _write()


def current() -> str:
    return " / ".join(_stack)


@contextlib.contextmanager
def lost_at(phase: str, how: signal.Signals) -> Iterator[None]:
    """For the block, this process sends itself ``how`` (SIGKILL, SIGSTOP) the moment it enters
    a phase whose name holds ``phase``, once that phase is written for the controller."""
    global _lost_at
    _lost_at = (phase, how)
    try:
        yield
    finally:
        _lost_at = None


def _write() -> None:
    path = os.environ.get(ENV)
    if not path:  # not in a world's rank (a kit test calling the rank side in-process)
        return
    with contextlib.suppress(OSError):  # an account for a failure must never cause one
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, current().encode())
        finally:
            os.close(fd)
    if _lost_at is not None and _lost_at[0] in current():
        os.kill(os.getpid(), _lost_at[1])

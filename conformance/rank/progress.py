"""Where this rank is in its task, for the controller's account of a rank that died or hung
("rank 1: died ... during training / step 1 (SGD) / backward").

The rank side names its phases here; each change is written to the file the rank loop names
in ``$CONFORMANCE_PHASE_FILE`` (``conformance.world.protocol.ENV_PHASE``), which the
controller reads when a rank cannot answer. A file rather than the control store: a write
costs microseconds and no round trip, and it outlives the process that wrote it. Another
node's rank (``$CONFORMANCE_NODE`` above 0) writes it into the control store as well: the
controller cannot read that machine's files, and a node that dies takes them with it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

from conformance.world import protocol, seal

ENV = protocol.ENV_PHASE

_stack: list[str] = []
# --chaos (and the kit's own fault tests): the phase, or part of its name, at whose entry this
# rank is lost, and what loses it (conformance/rank/faults.py arms it for one task)
_lost_at: tuple[str, Callable[[], None]] | None = None


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
def lost_at(phase: str, lose: Callable[[], None]) -> Iterator[None]:
    """For the block, ``lose()`` (this process sends itself SIGKILL, say) runs the moment this
    rank enters a phase whose name holds ``phase``, once that phase is written for the controller."""
    global _lost_at
    _lost_at = (phase, lose)
    try:
        yield
    finally:
        _lost_at = None


@functools.cache
def _control() -> seal.Channel | None:
    """The control store, for another node's rank; None on the controller's node."""
    if int(os.environ.get(protocol.ENV_NODE, "0")) == 0 or protocol.ENV_CONTROL not in os.environ:
        return None
    import datetime

    import torch.distributed as dist

    host, port = protocol.split_endpoint(os.environ[protocol.ENV_CONTROL])
    store: Any = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=60))
    return seal.Channel(store, seal.Seal(os.environ.get(seal.ENV_TOKEN)))


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
    with contextlib.suppress(Exception):  # the store gone: the controller is done with this world
        if (control := _control()) is not None:
            control.set(protocol.phase_key(int(os.environ["RANK"])), current())
    if _lost_at is not None and _lost_at[0] in current():
        _lost_at[1]()

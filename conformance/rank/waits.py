"""The asynchronous collectives Thunder issues outside its traces (a broadcast at setup, the
sync on leaving ``no_sync``) and never waits on.

torch.distributed defines an asynchronous collective's result only once its ``Work`` is
waited on: under NCCL the collective runs on a stream of its own, and a caller that reads the
tensor without waiting reads it too early. On gloo the result usually lands before anyone
reads it, so no value can show the race: whether the wait happens is what is recorded. Inside
its traces Thunder waits through its own ``wait`` symbol (the collectives area counts those);
this covers the Python calls around them, where Thunder calls ``torch.distributed`` itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d

# the collectives a transform calls through torch.distributed's Python API with ``async_op``
ASYNC_CALLS = (
    "broadcast",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
)

# read once, from torch's own definitions when the kit is imported: the traces' collectives call
# through the wrappers too, and a replacement's (*args, **kwargs) would hide async_op
_SIGNATURES = {name: inspect.signature(getattr(distributed_c10d, name)) for name in ASYNC_CALLS}


@dataclasses.dataclass
class _Issued:
    """One asynchronous collective (or coalesced group of them) and whether it was waited on."""

    call: str
    waited: bool = False


class _Work:
    """A ``Work`` handed back to the caller, marking its wait; every other use goes to it."""

    def __init__(self, work: Any, issued: _Issued) -> None:
        self._work, self._issued = work, issued

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._issued.waited = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _asking_async(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:  # the call itself is wrong: torch says so when it is made
        return False
    return bool(bound.arguments.get("async_op", False))


def _tracking(name: str, original: Any, signature: inspect.Signature, issued: list[_Issued]) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        work = original(*args, **kwargs)
        if work is None or not _asking_async(signature, args, kwargs):
            return work
        issued.append(_Issued(name))
        return _Work(work, issued[-1])

    return call


def _tracking_coalesced(original: Any, issued: list[_Issued]) -> Any:
    signature = inspect.signature(original)

    @contextlib.contextmanager
    def coalescing(*args: Any, **kwargs: Any) -> Iterator[Any]:
        asked = signature.bind(*args, **kwargs).arguments.get("async_ops", False)
        with original(*args, **kwargs) as manager:
            yield manager
        if asked:  # its works are the manager's: its wait() waits on them
            issued.append(_Issued("coalesced collectives"))
            waits, record = manager.wait, issued[-1]

            def wait() -> None:
                record.waited = True
                waits()

            manager.wait = wait

    return coalescing


@contextlib.contextmanager
def awaited(unwaited: list[str], phase: str) -> Iterator[None]:
    """While the block runs, every asynchronous collective called through torch.distributed's
    Python API (or a coalescing manager asked for asynchronous ops) is tracked; those not
    waited on when it ends are appended to ``unwaited`` as ``"{phase}: {call}"``."""
    issued: list[_Issued] = []
    # each module's own binding, restored as found: a caller (a planted bug, a user's hook) may
    # have replaced torch.distributed.<name> and not distributed_c10d.<name>, or the reverse
    modules = (distributed_c10d, dist)
    originals = {(module, name): getattr(module, name) for module in modules for name in ASYNC_CALLS}
    coalescing = distributed_c10d._coalescing_manager
    try:
        # Thunder calls both torch.distributed.<name> and distributed_c10d.<name>
        for (module, name), original in originals.items():
            setattr(module, name, _tracking(name, original, _SIGNATURES[name], issued))
        distributed_c10d._coalescing_manager = _tracking_coalesced(coalescing, issued)
        yield
    finally:
        for (module, name), original in originals.items():
            setattr(module, name, original)
        distributed_c10d._coalescing_manager = coalescing
        unwaited.extend(f"{phase}: {i.call}" for i in issued if not i.waited)

"""Measuring memory on a rank: the peak of what a block allocates and what it leaves alive,
and a census of every live storage.

On CPU a dispatch-mode tracker of storages (exact for what goes through the dispatcher;
torch's MemTracker leaves module hooks behind that break Thunder's next trace, and the
profiler's memory events give no peak); on CUDA the caching allocator's statistics. What
the numbers are held to is the memory check area's business (``conformance/checks/memory.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclasses.dataclass
class Reading:
    """Bytes on one device, read when a measured block ends."""

    peak: int = 0  # the most that the block's allocations held at once
    alive: int = 0  # what the block allocated and was still alive at its end


class _StorageTracker(TorchDispatchMode):
    """Live bytes of storages that ops allocate on one device while the mode is active.

    A storage is new when no input of the op shares it; its free is seen through a weak
    reference (torch keeps one Python object per storage alive as long as the storage).
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.live = self.peak = 0
        self._refs: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device != self.device:
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if not ptr or ptr in inputs or ptr in self._refs:
                continue
            nbytes = storage.nbytes()
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            self._refs[ptr] = weakref.ref(storage, lambda _, ptr=ptr, n=nbytes: self._free(ptr, n))
        return out

    def _free(self, ptr: int, nbytes: int) -> None:
        self.live -= nbytes
        self._refs.pop(ptr, None)


@contextlib.contextmanager
def measure(device: torch.device, settle: bool = False) -> Iterator[Reading]:
    """Read the block's peak and what it left alive on ``device``. ``settle``: on CPU, wait
    for what is alive to stop changing before reading it (see ``_settle``)."""
    reading = Reading()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield reading
        torch.cuda.synchronize(device)
        reading.peak = torch.cuda.max_memory_allocated(device) - base
        reading.alive = torch.cuda.memory_allocated(device) - base
        return
    with _StorageTracker(device) as tracker:
        yield reading
        if settle:
            _settle(tracker)
    reading.peak, reading.alive = tracker.peak, tracker.live


def _settle(tracker: _StorageTracker, step_s: float = 0.002, tries: int = 25) -> None:
    """Wait until the tracker's live bytes stop changing: gloo's worker threads let go of a
    finished collective's buffers a moment after ``wait()`` has returned."""
    for _ in range(tries):
        before = tracker.live
        time.sleep(step_s)
        if tracker.live == before:
            return


def census(device: torch.device, exclude: set[int]) -> int:
    """Bytes of every distinct tensor storage alive on ``device``, less those in ``exclude``
    (data pointers of tensors the kit itself holds)."""
    gc.collect()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.device != device or obj.is_meta:
                continue
            storage = obj.untyped_storage()
        except Exception:
            continue
        ptr = storage.data_ptr()
        if ptr and ptr not in exclude:
            seen[ptr] = storage.nbytes()
    return sum(seen.values())


def pointers(*tensors: torch.Tensor) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}

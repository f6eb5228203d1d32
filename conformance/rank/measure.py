"""Measuring memory on a rank: the peak of what a block allocates and what it leaves alive,
and a census of every live storage.

On CPU a dispatch-mode tracker of storages (exact for what goes through the dispatcher;
torch's MemTracker leaves module hooks behind that break Thunder's next trace, and the
profiler's memory events give no peak); on CUDA the caching allocator's statistics, which
count each allocation as its block (bytes rounded up to 512: ``storages.allocated_bytes``,
which the census and the memory area's expectations use there too). What the numbers are
held to is the memory check area's business (``conformance/checks/memory/__init__.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

from conformance.checks.storages import allocated_bytes
from fixtures.executors import ExecutorChoice


@dataclasses.dataclass
class Reading:
    """Bytes on one device, read when a measured block ends."""

    peak: int = 0  # the most that the block's allocations held at once
    alive: int = 0  # what the block allocated and was still alive at its end
    marks: list[int] = dataclasses.field(default_factory=list)  # what was alive at each ``mark()``
    _alive_now: Any = dataclasses.field(default=None, repr=False)

    def mark(self) -> None:
        """Note what the block's allocations hold at this moment (while the block runs)."""
        self.marks.append(self._alive_now())


class _StorageTracker(TorchDispatchMode):
    """Live bytes of storages that ops allocate on one device while the mode is active.

    A storage is new when no input of the op shares it; its free is seen through a weak
    reference (torch keeps one Python object per storage alive as long as the storage). A
    wrapper subclass (a DTensor) holds no storage of its own: its inner tensors' count.
    ``resizes``: storages may also be freed and allocated again in place by resizing them
    (FSDP2 frees an unsharded parameter with ``untyped_storage().resize_(0)``, which no op
    dispatches), so every op reads each tracked storage's size again; off, a storage counts
    the bytes it had when an op made it.
    """

    def __init__(self, device: torch.device, resizes: bool = False) -> None:
        super().__init__()
        self.device = device
        self.resizes = resizes
        self.live = self.peak = 0
        self._refs: dict[int, weakref.ref] = {}  # the storage's identity -> a weak reference to it
        self._counted: dict[int, int] = {}  # ... -> the bytes ``live`` counts for it

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile then compiles with the mode off and runs what it built with the mode on
        # (the default makes Dynamo run a frame op by op): ThunderFX's graphs reach Thunder as
        # unmeasured, and what Thunder's code calls goes through the dispatcher, seen here
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # only forwards: blame passes over this frame (``blame.INSTRUMENTATION``), so what the op
        # raises is its caller's; the kit's own bookkeeping is in ``_track``, blamed as the kit's
        out = func(*args, **(kwargs or {}))
        self._track(args, kwargs, out)
        return out

    def _track(self, args: Any, kwargs: Any, out: Any) -> None:
        """Count the storages that the op's outputs newly hold on the device."""
        inputs = {storage_identity(t) for t in plain_tensors((args, kwargs))}
        if self.resizes:
            self._recount()
        for t in plain_tensors(out):
            if t.device != self.device:
                continue
            key = storage_identity(t)
            if not key or key in inputs or key in self._refs:
                continue
            storage = t.untyped_storage()
            nbytes = storage.nbytes()
            self.live += nbytes
            self._counted[key] = nbytes
            self._refs[key] = weakref.ref(storage, lambda _, key=key: self._free(key))
        self.peak = max(self.peak, self.live)

    def _recount(self) -> None:
        """Read every tracked storage's size again (``resizes``)."""
        for key, ref in list(self._refs.items()):
            storage = ref()
            if storage is None:
                continue
            nbytes = storage.nbytes()
            self.live += nbytes - self._counted[key]
            self._counted[key] = nbytes

    def read(self) -> int:
        """What is alive now: sizes read again where storages resize outside ops."""
        if self.resizes:
            self._recount()
        return self.live

    def storages(self) -> dict[int, torch.UntypedStorage]:
        """Every storage counted and still alive, by identity (``storage_identity``)."""
        alive = {key: ref() for key, ref in list(self._refs.items())}
        return {key: storage for key, storage in alive.items() if storage is not None}

    def _free(self, key: int) -> None:
        self.live -= self._counted.pop(key, 0)
        self._refs.pop(key, None)


def plain_tensors(tree: Any) -> Iterator[torch.Tensor]:
    """Every tensor of ``tree`` that holds a storage: a wrapper subclass's inner tensors in
    its place (a DTensor's local shard)."""
    for t in tree_flatten(tree)[0]:
        if not isinstance(t, torch.Tensor):
            continue
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            yield from plain_tensors([getattr(t, n) for n in names])
        else:
            yield t


def storage_identity(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (its StorageImpl, which a resize keeps); 0 where it
    has none to read or holds no bytes (a storage FSDP2 freed by resizing it to nothing)."""
    try:
        storage = t.untyped_storage()
    except RuntimeError:
        return 0
    return storage._cdata if storage.nbytes() else 0


@contextlib.contextmanager
def measure(device: torch.device, settle: bool = False) -> Iterator[Reading]:
    """Read the block's peak and what it left alive on ``device``. ``settle``: on CPU, wait
    for what is alive to stop changing before reading it (see ``_settle``); on CUDA, collect
    garbage first (see ``_settle_cuda``)."""
    reading = Reading()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        reading._alive_now = lambda: torch.cuda.memory_allocated(device) - base
        yield reading
        if settle:
            _settle_cuda()
        torch.cuda.synchronize(device)
        reading.peak = torch.cuda.max_memory_allocated(device) - base
        reading.alive = torch.cuda.memory_allocated(device) - base
        return
    with _StorageTracker(device) as tracker:
        reading._alive_now = tracker.read
        yield reading
        if settle:
            _settle(tracker)
    reading.peak, reading.alive = tracker.peak, tracker.read()


def unmeasurable(device: torch.device, executors: ExecutorChoice) -> str | None:
    """Why the Thunder side's training cannot be measured on ``device``, or None: on the CPU
    the tracker is a dispatch mode, which sees what goes through the dispatcher, and the code
    Inductor generates (Thunder's torchcompile executor) allocates its buffers outside it.
    ThunderFX's graphs are measured: Thunder runs them, op by op through the dispatcher."""
    if device.type == "cuda" or not executors.compiled:
        return None
    return (
        f"the {executors.name} executor runs code Inductor generated, which allocates outside the dispatcher; "
        f"on {device.type} the kit measures memory through a dispatch mode, so the training phases went unmeasured"
    )


class Ledger:
    """What the Thunder side allocated since training began and still holds, kept across
    the phases of every step; the eager model's work between phases is not counted.
    A blind ledger (``measured=False``) wraps nothing around the phases and reads zero.

    Phases are measured in absolute terms, from the ledger's zero (the end of setup): a
    phase's peak includes what earlier phases left alive (the optimizer state, the forward's
    saved tensors during the backward), so that every bound reads as "a rank holds at most".
    On CUDA the allocator's statistics give the same numbers, as deltas of each phase.
    """

    def __init__(self, device: torch.device, measured: bool = True, resizes: bool = False) -> None:
        self.device = device
        self.measured = measured
        self.held = 0  # bytes allocated by the Thunder side and alive now
        self._tracker = _StorageTracker(device, resizes) if device.type != "cuda" else None

    @contextlib.contextmanager
    def phase(self, settle: bool = False) -> Iterator[Reading]:
        """The phase's peak and what is held at its end, both from the ledger's zero."""
        reading = Reading()
        tracker = self._tracker
        if not self.measured:
            reading._alive_now = lambda: 0
            yield reading
            return
        if tracker is None:
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield reading
            if settle:
                _settle_cuda()
            torch.cuda.synchronize(self.device)
            reading.peak = self.held + torch.cuda.max_memory_allocated(self.device) - base
            self.held += torch.cuda.memory_allocated(self.device) - base
            reading.alive = self.held
            return
        tracker.peak = tracker.live
        with tracker:
            yield reading
            if settle:
                # reference cycles the phase left behind are not alive, only uncollected (as
                # on CUDA, ``_settle_cuda``): whether the young generations ran before this
                # reading would otherwise depend on what the process allocated earlier
                gc.collect(1)
                _settle(tracker)
        reading.peak = tracker.peak
        reading.alive = self.held = tracker.read()

    def storages(self) -> dict[int, torch.UntypedStorage] | None:
        """The storages the Thunder side allocated since the ledger's zero and still holds,
        by identity; None where no tracker counts storages one by one (CUDA, a blind ledger)."""
        if not self.measured or self._tracker is None:
            return None
        self._tracker.read()
        return self._tracker.storages()

    def read(self, thorough: bool = False) -> int:
        """What is held now (frees since the last phase included). Reference cycles that
        hold tensors are collected first: the young generations always (microseconds),
        every generation where ``thorough`` (what the task made: the rank loop froze the rest)."""
        if not self.measured:
            return 0
        if self._tracker is not None:
            gc.collect() if thorough else gc.collect(1)
            _settle(self._tracker)  # gloo's threads may still hold a finished collective's output
            self.held = self._tracker.read()
            return self.held
        # CUDA: the allocator cannot tell the Thunder side's frees from the kit's allocations
        # in between (the eager model's steps), so only what the collection itself releases
        # (NCCL work objects and cycles that hold buffers) is taken off, as a delta around it
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        _settle_cuda(thorough)
        torch.cuda.synchronize(self.device)
        self.held += torch.cuda.memory_allocated(self.device) - before
        return self.held


# The name torch gives the threads that run a gloo process group's collectives.
GLOO_WORKER = "pt_gloo_runloop"


def gloo_workers_busy() -> bool:
    """Whether a gloo worker thread of this process is still on its way to idle.

    ``wait()`` returns once a collective is marked done, but the worker that ran it drops its
    reference to the collective's buffers only after that, before it sleeps on its queue
    again; on a loaded host it can be preempted in between for longer than any fixed pause,
    and the buffer would be read as held. Every collective a trace issued has been waited on when the kit settles, so a
    worker that is not asleep is one still letting go. Linux only (``/proc``): elsewhere the
    timing alone decides.
    """
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread has ended
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name == GLOO_WORKER and rest.split()[0] not in ("S", "I"):
            return True
    return False


# calibrated on a measurement: with the 2 ms criterion alone a loaded CI host once read a 1024 B all-reduce buffer
# held after a bfloat16 DDP backward (2026-11-23): docs/measurements.md#memory-headroom-and-estimates
def _settle(tracker: _StorageTracker, step_s: float = 0.002, limit_s: float = 2.0) -> None:
    """Wait until the tracker's live bytes stop changing and gloo's workers are asleep: they
    let go of a finished collective's buffers a moment after ``wait()`` has returned (see
    ``gloo_workers_busy``). A worker waiting for the GIL to free a tensor sleeps too, but it
    frees during the pause, which the live bytes then show."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = tracker.read()
        time.sleep(step_s)
        if tracker.read() == before and not gloo_workers_busy():
            return


def _settle_cuda(thorough: bool = False) -> None:
    """The CUDA counterpart of ``_settle``: ``torch.cuda.synchronize`` already waits for the
    kernels, but an NCCL work object may keep its collective's buffers (inputs, outputs, the
    flattened bucket) allocated until it is waited on and released; a work object a trace
    dropped inside a reference cycle lets go only when the garbage collector runs. Collect
    it (the young generations; every one where ``thorough``), as the CPU path does."""
    gc.collect() if thorough else gc.collect(1)


@dataclasses.dataclass
class Census:
    """Distinct tensor storages alive on a device."""

    nbytes: int  # bytes of every storage of more than one element (on CUDA each its allocator block)
    # storages only 0-d tensors view (scalars a module may keep: counted, not summed); a
    # one-row shard of a large world is a tensor like any other
    scalars: int


def census(device: torch.device, exclude: set[int], step_s: float = 0.002, limit_s: float = 2.0) -> Census:
    """Every distinct tensor storage alive on ``device``, less those in ``exclude`` (data
    pointers of tensors the kit itself holds), once two readings ``step_s`` apart agree and
    gloo's workers are asleep: they let go of a finished collective's buffers (a broadcast's,
    at setup) a moment after it has returned (see ``gloo_workers_busy``)."""
    deadline = time.monotonic() + limit_s
    gc.collect()  # once: what a reading after it could still find in a cycle is the youngest's
    reading = _census(device, exclude)
    while time.monotonic() < deadline:
        time.sleep(step_s)
        gc.collect(0)
        again = _census(device, exclude)
        if again == reading and not gloo_workers_busy():
            break
        reading = again
    return reading


def _census(device: torch.device, exclude: set[int]) -> Census:
    seen: dict[int, tuple[int, bool]] = {}  # data pointer -> (bytes, viewed only by 0-d tensors)
    # a tensor subclass answers through its own __torch_function__, which may raise on its
    # device or storage (a broken one of Thunder's): read every tensor as a plain one, or
    # its bytes would go uncounted
    with torch._C.DisableTorchFunctionSubclass():
        for obj in gc.get_objects():
            try:
                if not isinstance(obj, torch.Tensor) or obj.device != device or obj.is_meta:
                    continue
                storage = obj.untyped_storage()
                # a fake or functional tensor that torch.compile left in its caches holds no
                # memory and refuses to name a data pointer
                ptr = storage.data_ptr()
                zero_d = obj.dim() == 0
            except Exception:
                continue
            if ptr and ptr not in exclude:
                # on CUDA each storage rounded to its allocator block rather than the allocator
                # read: so the census still leaves out the kit's own tensors and 0-d storages,
                # and reads in the allocator's units, as memory_allocated and the expectations do
                nbytes = allocated_bytes(storage.nbytes(), device)
                seen[ptr] = (nbytes, zero_d and seen.get(ptr, (0, True))[1])
    scalars = [ptr for ptr, (_, only_0d) in seen.items() if only_0d]
    return Census(sum(n for n, _ in seen.values()) - sum(seen[p][0] for p in scalars), len(scalars))


def pointers(*tensors: torch.Tensor) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}

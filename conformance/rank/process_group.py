"""The collectives a block issues at the process group, whoever issues them: under PyTorch's
parallelism FSDP2 and DDP are handed a process group of the kit's (``counted_group``), which
hands every collective to the world's own backend (gloo, NCCL) and records it first, wherever
the call came from: FSDP2's hooks, DDP's reducer and its buffer broadcasts in C++, functional
collectives (DTensor's, a compiled graph's), ``torch.distributed``'s Python API. Calls through
that API on any other group (the default one: a compiled graph's stray collective) are counted
where the API is called, as the functions in its namespace are replaced while counting.

CommDebugMode counts collectives too, but it is a dispatch mode, and Dynamo runs a frame eager
while one is active: ThunderFX would compile nothing. Neither of these is met by Dynamo: the
group is a C++ object to it, and the API's callers are the parallelism's hooks, which it leaves
eager. Unseen: a collective issued beneath the Python API on a group other than the counted one.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.record import Issued

# function -> (kind, the argument holding the whole buffer: what is all-gathered into, what is
# reduce-scattered from, what is all-reduced or broadcast)
FUNCTIONS = {
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "_all_gather_base": ("all_gather", "output_tensor"),
    "all_gather": ("all_gather", "tensor_list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "_reduce_scatter_base": ("reduce_scatter", "input"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
    "all_to_all_single": ("all_to_all", "input"),
    "all_to_all": ("all_to_all", "input_tensor_list"),
}

_depth = threading.local()  # a collective that calls another (a deprecated alias) counts once

# c10d's collective methods -> (kind, the position of the argument holding the whole buffer):
# what FSDP2, DDP's reducer, functional collectives and the Python API all end in
METHODS: dict[str, tuple[str, int | None]] = {
    "allreduce": ("all_reduce", 0),  # (tensors, opts)
    "allreduce_coalesced": ("all_reduce", 0),
    "broadcast": ("broadcast", 0),  # (tensors, opts)
    "allgather": ("all_gather", 0),  # (output lists, inputs, opts)
    "allgather_coalesced": ("all_gather", 0),
    "_allgather_base": ("all_gather", 0),  # (output, input, opts)
    "allgather_into_tensor_coalesced": ("all_gather", 0),  # (outputs, inputs, opts)
    "reduce_scatter": ("reduce_scatter", 1),  # (outputs, input lists, opts)
    "_reduce_scatter_base": ("reduce_scatter", 1),  # (output, input, opts)
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 1),  # (outputs, inputs, opts)
    "alltoall_base": ("all_to_all", 1),  # (output, input, output splits, input splits, opts)
    "alltoall": ("all_to_all", 1),  # (outputs, inputs, opts)
    "reduce": ("reduce", 0),
    "gather": ("gather", 1),
    "scatter": ("scatter", 1),
    "send": ("send", 0),
    "recv": ("recv", 0),
    "recv_anysource": ("recv", 0),
    "barrier": ("barrier", None),
}
# the name the counting group's backend is registered under (``counted_group``)
COUNTED_BACKEND = "kit_counted"

# Where collectives are recorded while ``counting`` runs: one target for the whole process,
# not per thread, since DDP's reducer issues from the autograd engine's threads on CUDA.
_lock = threading.Lock()
_target: tuple[list[Issued], str] | None = None


def _record(kind: str, whole: Any) -> None:
    with _lock:
        target = _target
    if target is not None:
        into, phase = target
        into.append(Issued(phase=phase, kind=kind, dtype=_dtype(whole), nbytes=_bytes(whole)))


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _dtype(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).removeprefix("torch.")
    if isinstance(value, (list, tuple)) and value:
        return _dtype(value[0])
    return "none"


class CountingGroup(dist.ProcessGroup):
    """A process group that records each collective and hands it to ``inner``, a backend of the
    world's own kind over the same ranks: c10d calls these methods wherever a collective on
    this group comes from (Python, C++ or a functional collective's kernel)."""

    def __init__(self, inner: Any, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._inner = inner

    def getBackendName(self) -> str:
        return COUNTED_BACKEND

    @property
    def group_name(self) -> str:
        # c10d keeps a Python group's name in its world (the base reads its backend's, which
        # a Python group has none of); functional collectives find the group by it
        return dist.distributed_c10d._world.pg_names[self]

    def __repr__(self) -> str:
        return f"CountingGroup({self._inner!r})"


def _method(name: str, kind: str, position: int | None) -> Any:
    def method(self: CountingGroup, *args: Any, **kwargs: Any) -> Any:
        _record(kind, args[position] if position is not None and position < len(args) else None)
        return getattr(self._inner, name)(*args, **kwargs)

    method.__name__ = name
    return method


for _name, (_kind, _position) in METHODS.items():
    setattr(CountingGroup, _name, _method(_name, _kind, _position))


def _create(options: Any, backend_options: Any) -> CountingGroup:
    """c10d's constructor of a ``COUNTED_BACKEND`` group: the group ``counted_group`` has just
    made of the world's own backend over the same ranks, inside a ``CountingGroup``."""
    if _wrapping is None:
        raise RuntimeError(f"a {COUNTED_BACKEND} group is made by counted_group() alone")
    return CountingGroup(_wrapping, options.group_rank, options.group_size)


@functools.cache
def _registered() -> None:
    dist.Backend.register_backend(COUNTED_BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


# one per world: the default group it was made in, and it (held, so that a later world's
# default group cannot be taken for this one's)
_made: tuple[Any, CountingGroup] | None = None
_wrapping: Any = None  # the group a CountingGroup being made will hand its collectives to


def counted_group() -> CountingGroup:
    """The group over every rank of the world whose collectives are all counted: made once per
    world, on every rank at once (as ``new_group`` is), where PyTorch's parallelism is first
    composed. What it hands them to is a group torch made as ``new_group`` makes any, of the
    world's backend, so that every collective c10d offers goes through as it would."""
    global _made, _wrapping
    world = dist.distributed_c10d._get_default_group()
    if _made is None or _made[0] is not world:
        _registered()
        _wrapping = dist.new_group()
        try:
            _made = (world, dist.new_group(backend=COUNTED_BACKEND))
        finally:
            _wrapping = None
    return _made[1]


def _counted(name: str, original: Any) -> Any:
    kind, buffer = FUNCTIONS[name]
    signature = inspect.signature(original)

    def issue(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        if depth == 0:
            arguments = signature.bind_partial(*args, **kwargs).arguments
            if not isinstance(arguments.get("group"), CountingGroup):  # that group records its own
                _record(kind, arguments.get(buffer))
        _depth.n = depth + 1
        try:
            return original(*args, **kwargs)
        finally:
            _depth.n = depth

    return issue


def calls_for(composition: Any) -> list[Issued] | None:
    """Where a composition's collectives are counted: an empty list to count them into under
    PyTorch's parallelism, data or tensor (its hooks and DTensor issue them), None under
    Thunder's own transforms (its traces hold them)."""
    return None if composition.parallelism == "thunder" else []


@contextlib.contextmanager
def counting(into: list[Issued] | None, phase: str) -> Iterator[None]:
    """While the block runs, every collective issued on the counted group, and every one issued
    through ``torch.distributed``'s Python API on another, is appended to ``into`` as issued in
    ``phase`` (``into`` None: nothing is counted)."""
    global _target
    if into is None:
        yield
        return
    originals = {name: getattr(dist, name) for name in FUNCTIONS if hasattr(dist, name)}
    for name, original in originals.items():
        setattr(dist, name, _counted(name, original))
    with _lock:
        outer, _target = _target, (into, phase)
    try:
        yield
    finally:
        with _lock:
            _target = outer
        for name, original in originals.items():
            setattr(dist, name, original)

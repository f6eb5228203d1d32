"""The collectives a block issues at the process group, through ``torch.distributed``'s Python
API, whatever thread issues them: under PyTorch's parallelism FSDP2's hooks call
``dist.all_gather_into_tensor`` and ``dist.reduce_scatter_tensor`` through that namespace.

CommDebugMode counts them too, but it is a dispatch mode, and Dynamo runs a frame eager while
one is active: ThunderFX would compile nothing. A function replaced in ``torch.distributed``'s
namespace is met only by the code that calls it, FSDP2's hooks, which Dynamo leaves eager.
DDP's reducer all-reduces from C++, beneath this API, unless a communication hook does it in
Python: the compositions register PyTorch's own ``allreduce_hook`` (fixtures/torch_parallel.py).
DDP's buffer broadcasts stay in C++ and unseen."""

from __future__ import annotations

import contextlib
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


def _counted(name: str, original: Any, into: list[Issued], phase: str) -> Any:
    kind, buffer = FUNCTIONS[name]
    signature = inspect.signature(original)

    def issue(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        if depth == 0:
            whole = signature.bind_partial(*args, **kwargs).arguments.get(buffer)
            into.append(Issued(phase=phase, kind=kind, dtype=_dtype(whole), nbytes=_bytes(whole)))
        _depth.n = depth + 1
        try:
            return original(*args, **kwargs)
        finally:
            _depth.n = depth

    return issue


def calls_for(composition: Any) -> list[Issued] | None:
    """Where a composition's collectives are counted: an empty list to count them into under
    PyTorch's parallelism (its hooks issue them), None under Thunder's own transforms (its
    traces hold them)."""
    return [] if composition.parallelism == "torch" else None


@contextlib.contextmanager
def counting(into: list[Issued] | None, phase: str) -> Iterator[None]:
    """While the block runs, every collective issued through ``torch.distributed`` is appended
    to ``into`` as issued in ``phase`` (``into`` None: nothing is counted)."""
    if into is None:
        yield
        return
    originals = {name: getattr(dist, name) for name in FUNCTIONS if hasattr(dist, name)}
    for name, original in originals.items():
        setattr(dist, name, _counted(name, original, into, phase))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)

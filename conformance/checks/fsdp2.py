"""FSDP2's collectives, derived from the model and the world size: what
``torch.distributed.fsdp.fully_shard`` must issue at the process group in each phase of a
training step, for a model sharded as fixtures/torch_parallel.py shards it (each numbered block
a unit, then the root; or the root alone: the composition's ``fsdp2_wrap``).

A unit manages the distinct parameter storages under it that no inner unit manages (a tied
weight is one storage). Per step, each unit that manages any: one all-gather in its forward
(into the padded whole: dim 0 rounded up to a multiple of the world size, as FSDP2 chunks it),
one more in the backward where it resharded after the forward (ZERO3: ``reshard_after_forward``
True, the root included, as it is passed to every unit), and one reduce-scatter in the backward
of the padded gradients of its trainable storages (where it has any); nothing all-reduced or
broadcast, and nothing at all in the optimizer step (the shards step where they lie). Thunder
compiles the units' bodies and must add nothing: a collective of its own is one too many.
"""

from __future__ import annotations

import dataclasses

import torch

from conformance.checks.storages import distinct_storages, padded_shape_bytes
from fixtures.torch_parallel import units

PHASES = ("forward", "backward", "optimizer step")
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all")


@dataclasses.dataclass(frozen=True)
class Expected:
    """What one phase of a step issues of one kind: how many, and their whole buffers' bytes."""

    count: int = 0
    nbytes: int = 0


def managed(model: torch.nn.Module, wrap: str) -> list[list[torch.Tensor]]:
    """Per unit (as ``wrap`` makes them), innermost first, the distinct storages it manages."""
    claimed: set[int] = set()
    out = []
    for unit in units(model, wrap):
        mine = [p for p in distinct_storages(unit).values() if id(p) not in claimed]
        claimed.update(id(p) for p in mine)
        out.append(mine)
    return out


def _padded(p: torch.Tensor, world_size: int, dtype: torch.dtype | None) -> int:
    """``p``'s bytes padded as FSDP2 chunks it, in ``dtype`` (None: its own)."""
    size = p.element_size() if dtype is None else dtype.itemsize
    return padded_shape_bytes(tuple(p.shape), size, world_size)


def gathered_units(
    model: torch.nn.Module, world_size: int, mixed: tuple[torch.dtype, torch.dtype] | None, wrap: str
) -> list[list[int]]:
    """Per unit that manages any storage, innermost first, the padded bytes of each storage
    its all-gather produces (under mixed precision, ``(param_dtype, reduce_dtype)``: in the
    param dtype, as FSDP2 casts the shards before gathering them)."""
    gathered = None if mixed is None else mixed[0]
    return [[_padded(p, world_size, gathered) for p in storages] for storages in managed(model, wrap) if storages]


def expected(
    model: torch.nn.Module,
    sharding: str,
    world_size: int,
    mixed: tuple[torch.dtype, torch.dtype] | None,
    wrap: str,
) -> dict[str, dict[str, Expected]]:
    """Phase -> kind -> what a training step issues at the process group (kinds not named:
    none), the units as ``wrap`` makes them. Under mixed precision (``(param_dtype,
    reduce_dtype)``; None: none) the all-gathers move the param dtype and the reduce-scatters
    the reduce dtype."""
    units_storages = managed(model, wrap)
    gathered = [sum(unit) for unit in gathered_units(model, world_size, mixed, wrap)]
    reduced_in = None if mixed is None else mixed[1]
    reduced = [
        sum(_padded(p, world_size, reduced_in) for p in storages if p.requires_grad)
        for storages in units_storages
        if any(p.requires_grad for p in storages)
    ]
    forward = Expected(len(gathered), sum(gathered))
    regathered = forward if sharding == "zero3" else Expected()
    return {
        "forward": {"all_gather": forward},
        "backward": {"all_gather": regathered, "reduce_scatter": Expected(len(reduced), sum(reduced))},
        "optimizer step": {},
    }

"""Tensor parallelism's collectives and placements, derived from the plan, the model and the
world size (Megatron-LM's arithmetic, as PyTorch's ``ColwiseParallel`` and ``RowwiseParallel``
implement it), for the plans fixtures/tensor_parallel.py hands ``parallelize_module``.

A column-wise Linear holds a dim-0 shard of its weight (and of its bias) and reads its whole
input: its forward issues nothing, and its output stays split on the last dimension. A row-wise
Linear holds a dim-1 shard of its weight and the whole bias, reads the split input, and sums its
partial outputs: one all-reduce of its output per call. In the backward the roles swap: each
column-wise call whose input needs a gradient all-reduces that gradient (every rank computed a
partial one), the row-wise ones issue nothing. The optimizer step steps each shard where it
lies: nothing. Thunder compiles the model and must add nothing.
"""

from __future__ import annotations

import math

from conformance.checks.fsdp2 import Expected
from conformance.checks.record import PlannedLayer
from fixtures.tensor_parallel import COLWISE, ROWWISE

PHASES = ("forward", "backward", "optimizer step")
SHARD_ROWS, SHARD_COLUMNS, REPLICATE = "shard(0)", "shard(1)", "replicate"


def expected(layers: list[PlannedLayer], trained: bool) -> dict[str, dict[str, Expected]]:
    """Phase -> kind -> what one step issues (kinds not named: none); without training, the
    forward alone."""
    rows = [c for layer in layers if layer.style == ROWWISE for c in layer.calls]
    cols = [c for layer in layers if layer.style == COLWISE for c in layer.calls if c.input_requires_grad]
    forward = Expected(len(rows), sum(math.prod(c.output_shape) * c.itemsize for c in rows))
    if not trained:
        return {"forward": {"all_reduce": forward}}
    # a Linear's input has its output's dtype: its input gradient's bytes are the input's
    backward = Expected(len(cols), sum(math.prod(c.input_shape) * c.itemsize for c in cols))
    return {"forward": {"all_reduce": forward}, "backward": {"all_reduce": backward}, "optimizer step": {}}


def placements(layers: list[PlannedLayer], parameters: list[str]) -> dict[str, tuple[str, ...] | None]:
    """Parameter -> the placements its DTensor must have on the one-dimensional mesh (None: the
    plan leaves it a plain tensor, whole on every rank)."""
    styles = {layer.name: layer.style for layer in layers}
    out: dict[str, tuple[str, ...] | None] = {}
    for name in parameters:
        owner, _, leaf = name.rpartition(".")
        style = styles.get(owner)
        if style == COLWISE:
            out[name] = (SHARD_ROWS,)
        elif style == ROWWISE:
            out[name] = (SHARD_COLUMNS,) if leaf == "weight" else (REPLICATE,)
        else:
            out[name] = None
    return out


def local_shape(shape: tuple[int, ...], placed: tuple[str, ...] | None, rank: int, world: int) -> tuple[int, ...]:
    """The shape ``rank`` holds of a parameter of ``shape`` so placed: a shard cuts its dim as
    ``torch.chunk`` does (pieces of ceil(n / world), the last ones shorter or empty)."""
    if not placed or placed[0] == REPLICATE:
        return shape
    dim = 0 if placed[0] == SHARD_ROWS else 1
    piece = -(-shape[dim] // world)
    held = max(0, min(piece, shape[dim] - rank * piece))
    return (*shape[:dim], held, *shape[dim + 1 :])


def held_elements(shape: tuple[int, ...], placed: tuple[str, ...] | None, rank: int, world: int) -> int:
    """The elements ``rank``'s storage of a parameter so placed holds. ``distribute_tensor``
    scatters pieces padded to ceil(n / world) and unpads a short one by narrowing it: on dim 0 a
    view, so the padded piece stays held; on another dim a copy of the narrowed piece (measured
    on torch 2.11.0: the MLP's fc1 weight holds 7 x 12 at rank 2 of 3, its 6 rows' 72 shown)."""
    if placed and placed[0] == SHARD_ROWS and shape:
        return -(-shape[0] // world) * math.prod(shape[1:])
    return math.prod(local_shape(shape, placed, rank, world))

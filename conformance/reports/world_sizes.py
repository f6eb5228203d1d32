"""A model's sharding arithmetic at every world size, from the shapes a simulated world's
ranks report (the sharding area's ``model`` metric: each distinct parameter storage's shape
and element size, and the buffers' bytes): what one rank should hold after setup and what
its forward should all-gather, for scale.png to draw the measurements against. Arithmetic
on shapes (``storages.padded_shape_bytes``, as the checks pad): no model is built here."""

from __future__ import annotations

import dataclasses
from typing import Any

from conformance.checks.storages import padded_shape_bytes

SIZES = range(4, 1025)


@dataclasses.dataclass(frozen=True)
class Arithmetic:
    sizes: list[int]
    held: list[int]  # bytes one rank holds after setup: its shards and every buffer
    gathered: list[int]  # bytes the forward all-gathers: every distinct storage, dim 0 padded


def arithmetic(model: Any, sizes: range = SIZES) -> Arithmetic | None:
    """The arithmetic of a model as the ranks described it, or None where they did not (a
    report of an older kit)."""
    if not isinstance(model, dict) or not isinstance(model.get("storages"), list):
        return None
    storages = [(s["shape"], s["element_size"]) for s in model["storages"]]
    buffers = model.get("buffer bytes", 0)
    gathered = [sum(padded_shape_bytes(shape, size, n) for shape, size in storages) for n in sizes]
    return Arithmetic(
        sizes=list(sizes), held=[g // n + buffers for g, n in zip(gathered, sizes, strict=True)], gathered=gathered
    )

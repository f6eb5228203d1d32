"""A model's sharding arithmetic at every world size, from its shapes alone: what one rank of
a simulated world (conformance/rank/simulate.py) should hold after setup and what its forward
should all-gather, for scale.png to draw the measurements against."""

from __future__ import annotations

import dataclasses

import torch

from conformance.checks.storages import distinct_storages, padded_bytes, shard_bytes
from fixtures.models import fixture_for

SIZES = range(4, 1025)


@dataclasses.dataclass(frozen=True)
class Arithmetic:
    sizes: list[int]
    held: list[int]  # bytes one rank holds after setup: its shards and every buffer
    gathered: list[int]  # bytes the forward all-gathers: every distinct storage, dim 0 padded


def arithmetic(model: str, tie: str, dtype: str, sizes: range = SIZES) -> Arithmetic | None:
    """The arithmetic of ``model``, or None for a model this kit has no fixture for (a report
    written by another version of the kit)."""
    try:
        fixture = fixture_for(model)
    except KeyError:
        return None
    with torch.device("meta"):  # shapes only: a 7B-wide model costs nothing here
        module = fixture.build(tie == "tied").to(getattr(torch, dtype))
    buffers = sum(b.nbytes for b in module.buffers())
    storages = list(distinct_storages(module).values())
    return Arithmetic(
        sizes=list(sizes),
        held=[shard_bytes(module, n) + buffers for n in sizes],
        gathered=[sum(padded_bytes(p, n) for p in storages) for n in sizes],
    )

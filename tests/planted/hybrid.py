"""Bugs planted in Thunder's hybrid sharding (the FSDP plugin over a ("ddp", "fsdp") mesh). On
the pin every hybrid cell raises at setup, so each bug is planted on the fix that lets it set up
(``tests.planted.fixes.mapped_hybrid``): what a Thunder that fixed the raise could still get
wrong, caught by numerics and by the collectives' groups."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tests.planted.cells import Pred
from tests.planted.fixes import mapped_hybrid
from tests.planted.record import Expect, planted

HYBRID: Pred = lambda cell: cell.composition == "jit_hybrid"  # noqa: E731


@planted(
    {
        "numerics": Expect(HYBRID, words="gradients"),
        "collectives": Expect(HYBRID, words="backward all_reduce groups"),
    },
    cells=(HYBRID, lambda c: not HYBRID(c) and c.composition == "plugins_fsdp"),
    at_raises=True,
)
@contextlib.contextmanager
def hybrid_reduces_within_the_row() -> Iterator[None]:
    """The plugin hands DDP's transform the mesh's FSDP group, not its DDP one: each rank's
    gradient shard is averaged with the other shards of its own row (other parameters' rows),
    and never with its replica in the other row."""
    with mapped_hybrid(ddp_dim="fsdp"):
        yield

"""Bugs planted in ThunderFX, caught by the collectives area at the process group: under FSDP2
and DDP every collective is theirs, so one that Thunder's compiled code issues is one too many."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.planted.cells import Pred
from tests.planted.compiled import JITTED, THUNDERFX
from tests.planted.patching import each_compiled_graph
from tests.planted.record import Expect, planted

OVER_FSDP2: Pred = lambda cell: cell.composition == "thunderfx_fsdp2"  # noqa: E731
OVER_DDP: Pred = lambda cell: THUNDERFX(cell) and not OVER_FSDP2(cell)  # noqa: E731


# the smallest stray collective there is: one all-reduce of one float per compiled graph's call
@planted(
    {"collectives": Expect(THUNDERFX, words="forward all_reduces: expected 0, got")},
    cells=(OVER_FSDP2, OVER_DDP, JITTED),
    parallelisms=frozenset({"torch"}),
)
@contextlib.contextmanager
def thunderfx_syncs_every_call() -> Iterator[None]:
    """Every graph ThunderFX compiles first all-reduces a one-element tensor of zeros on each
    call (a consistency check between ranks, left in): the model trains exactly as eager does,
    and each forward issues one collective more than FSDP2's own."""
    import torch

    def synced(split: Any) -> Any:
        def call(*inputs: Any) -> Any:
            torch.distributed.all_reduce(torch.zeros(1))
            return split(*inputs)

        return call

    with each_compiled_graph(synced):
        yield

"""Bugs planted in ThunderFX, caught by the collectives area at the process group: under FSDP2
and DDP every collective is theirs, so one that Thunder's compiled code issues is one too many."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from fixtures.compositions import COMPOSITIONS
from tests.planted.cells import Pred
from tests.planted.compiled import JITTED, THUNDERFX
from tests.planted.patching import each_compiled_graph
from tests.planted.record import Expect, planted

OVER_FSDP2: Pred = lambda cell: THUNDERFX(cell) and not COMPOSITIONS[cell.composition].replicated  # noqa: E731
OVER_DDP: Pred = lambda cell: THUNDERFX(cell) and not OVER_FSDP2(cell)  # noqa: E731
# one all-reduce more in the forwards: of every step ("forward") or, where DDP's second step owes
# its bucket rebuild's broadcasts, of each group of steps owing alike ("forward of steps 1")
STRAY = "all_reduces: expected 0, got"


def _each_call_first(sync: Callable[[], Any]) -> contextlib.AbstractContextManager[None]:
    """Every graph ThunderFX compiles calls ``sync`` first on each call."""

    def synced(split: Any) -> Any:
        def call(*inputs: Any) -> Any:
            sync()
            return split(*inputs)

        return call

    return each_compiled_graph(synced)


# the smallest stray collective there is: one all-reduce of one float per compiled graph's call
@planted(
    {"collectives": Expect(THUNDERFX, words=STRAY)},
    cells=(OVER_FSDP2, OVER_DDP, JITTED),
    parallelisms=frozenset({"torch"}),
)
@contextlib.contextmanager
def thunderfx_syncs_every_call() -> Iterator[None]:
    """Every graph ThunderFX compiles first all-reduces a one-element tensor of zeros on each
    call (a consistency check between ranks, left in): the model trains exactly as eager does,
    and each forward issues one collective more than FSDP2's own."""
    import torch

    with _each_call_first(lambda: torch.distributed.all_reduce(torch.zeros(1))):
        yield


# the same stray collective beneath torch.distributed's Python API, as a compiled graph issues
# one: a functional collective's ops on the group the model's collectives go to (the counting
# group c10d hands it to), which replacing the API's functions never met
@planted(
    {"collectives": Expect(THUNDERFX, words=STRAY)},
    cells=(OVER_FSDP2, OVER_DDP, JITTED),
    parallelisms=frozenset({"torch"}),
)
@contextlib.contextmanager
def thunderfx_syncs_through_functional_collectives() -> Iterator[None]:
    """Every graph ThunderFX compiles first all-reduces a one-element tensor of zeros through
    ``torch.ops._c10d_functional`` (all_reduce, then wait_tensor), on the group FSDP2's or DDP's
    own collectives go to: the model trains exactly as eager does."""
    import torch

    from conformance.rank.process_group import counted_group

    def sync() -> None:
        functional = torch.ops._c10d_functional
        functional.wait_tensor(functional.all_reduce(torch.zeros(1), "sum", counted_group().group_name))

    with _each_call_first(sync):
        yield

"""Bugs planted in ThunderFX's compiled graphs that hold a snapshot of a parameter, the class
of ``fully_shard(thunder.jit(block))``'s own bug, caught by the numerics area: a compiled
graph that reads the values a parameter had when it was first called trains on stale weights
once the optimizer has stepped."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.planted.cells import Pred
from tests.planted.compiled import JITTED, THUNDERFX
from tests.planted.process_group import OVER_DDP, OVER_FSDP2
from tests.planted.record import Expect, planted

FLOAT32: Pred = lambda cell: THUNDERFX(cell) and cell.dtype == "float32"  # noqa: E731
# in bfloat16 one SGD step of one weight may sit within eager's own rounding against its twin
BFLOAT16: Pred = lambda cell: THUNDERFX(cell) and cell.dtype == "bfloat16"  # noqa: E731


# the least a snapshot can be: one parameter per graph, one optimizer step stale, its gradient
# still reaching the parameter (so FSDP2's and DDP's collectives are untouched)
@planted(
    {"numerics": Expect(FLOAT32, BFLOAT16, words="at step 1 (SGD)")},
    cells=(
        lambda cell: OVER_FSDP2(cell) and FLOAT32(cell),
        lambda cell: OVER_DDP(cell) and FLOAT32(cell),
        lambda cell: OVER_DDP(cell) and BFLOAT16(cell),
        JITTED,
    ),
    parallelisms=frozenset({"torch"}),
)
@contextlib.contextmanager
def thunderfx_graph_keeps_first_parameter_values() -> Iterator[None]:
    """Each graph ThunderFX compiles keeps the values its last parameter input had at its first
    call and computes with those ever after; the gradient still flows to the parameter. Step 0
    is exact; from step 1 the forward runs one optimizer step behind on that weight."""
    import torch
    from thunder.dynamo import compiler

    original = compiler._splitter

    def _splitter(gm: Any, *args: Any, **kwargs: Any) -> Any:
        split, info = original(gm, *args, **kwargs)
        held: dict[int, torch.Tensor] = {}

        def stale(*inputs: Any) -> Any:
            params = [i for i, t in enumerate(inputs) if isinstance(t, torch.nn.Parameter)]
            if not params:
                return split(*inputs)
            i, inputs = params[-1], list(inputs)
            first = held.setdefault(i, inputs[i].detach().clone())
            if first.shape == inputs[i].shape:  # the value of the first call, the gradient of this one
                inputs[i] = inputs[i] + (first - inputs[i]).detach()
            return split(*inputs)

        return stale, info

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiler, "_splitter", _splitter)
        yield

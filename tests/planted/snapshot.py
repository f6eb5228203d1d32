"""Bugs planted in ThunderFX's compiled graphs that hold a snapshot of a parameter, the class
of ``fully_shard(thunder.jit(block))``'s own bug, caught by the numerics area: a compiled
graph that reads the values a parameter had when it was first called trains on stale weights
once the optimizer has stepped; and by the memory area, which finds the snapshot held."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.planted.compiled import JITTED, THUNDERFX
from tests.planted.patching import each_compiled_graph
from tests.planted.process_group import OVER_DDP, OVER_FSDP2
from tests.planted.record import Expect, planted


# the least a snapshot can be in time: one optimizer step stale, every parameter a compiled
# graph reads, its gradient still reaching the parameter (FSDP2's and DDP's collectives are
# untouched); one parameter alone sits within bfloat16's rounding against the twin
# the snapshot is also memory: every parameter a graph reads, copied and held from its first call
# (exact rows, FSDP2's cells; under DDP the pin's entry for torch.compile(DDP)'s kept activations
# may cover the bytes)
@planted(
    {
        "numerics": Expect(THUNDERFX, words="at step 1 (SGD)"),
        "memory": Expect(OVER_FSDP2, OVER_DDP, words="memory held after backward at step 0"),
    },
    cells=(OVER_FSDP2, OVER_DDP, JITTED),
    parallelisms=frozenset({"torch"}),
)
@contextlib.contextmanager
def thunderfx_graph_keeps_first_parameter_values() -> Iterator[None]:
    """Each graph ThunderFX compiles keeps the values its parameter inputs had at its first
    call and computes with those ever after; the gradients still flow to the parameters. Step 0
    is exact; from step 1 the forward runs one optimizer step behind."""
    import torch

    def stale(split: Any) -> Any:
        held: dict[int, torch.Tensor] = {}

        def call(*inputs: Any) -> Any:
            inputs = list(inputs)
            for i, t in enumerate(inputs):
                if isinstance(t, torch.nn.Parameter):
                    first = held.setdefault(i, t.detach().clone())
                    if first.shape == t.shape:  # the value of the first call, the gradient of this one
                        inputs[i] = t + (first - t).detach()
            return split(*inputs)

        return call

    with each_compiled_graph(stale):
        yield

"""Bugs planted in ThunderFX's compiled graphs that save a copy of a parameter for the backward,
caught by the memory area: under FSDP2 a saved reference to an unsharded parameter is freed with
the unit's resharding, a copy is not; eager PyTorch saves none. The model trains exactly as
eager does, and nothing outlives the step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.planted.compiled import JITTED, THUNDERFX
from tests.planted.patching import each_compiled_graph
from tests.planted.process_group import OVER_DDP, OVER_FSDP2
from tests.planted.record import Expect, planted


# the least a copy can be: of one parameter, each graph's smallest that is not constant (a
# bias of a few floats), for its own backward only
@planted(
    {"memory": Expect(THUNDERFX, words="parameter copies after forward")},
    cells=(OVER_FSDP2, OVER_DDP, JITTED),
    parallelisms=frozenset({"torch"}),
)
@contextlib.contextmanager
def thunderfx_graph_saves_a_parameter_copy() -> Iterator[None]:
    """Each call of a graph ThunderFX compiles saves, beside its output, a copy of the smallest
    parameter it reads (not constant), freed when its backward runs: the values, the
    gradients and the collectives are untouched."""
    import torch

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, copy: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(copy)
            return out.view_as(out)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
            return None, grad

    def saving(split: Any) -> Any:
        def call(*inputs: Any) -> Any:
            out = split(*inputs)
            params = [t for t in inputs if isinstance(t, torch.nn.Parameter) and t.numel() > 1]
            params = [t for t in params if bool((t != t.flatten()[0]).any())]
            if not params or not isinstance(out, (tuple, list)):
                return out
            copy = min(params, key=lambda t: t.numel()).detach().clone()
            outs = list(out)
            for i, o in enumerate(outs):
                if isinstance(o, torch.Tensor) and o.requires_grad:
                    outs[i] = Keep.apply(copy, o)
                    break
            return type(out)(outs)

        return call

    with each_compiled_graph(saving):
        yield

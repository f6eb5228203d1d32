"""What a forward left alive, storage by storage, against what holds it (``rank/held.py``):
the autograd graph's saved tensors, a cache beyond it, a copy of a parameter; one process, no
world. Each case is built so that the expected bytes follow from the shapes alone."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from conformance.rank import held
from conformance.rank.measure import Ledger

CPU = torch.device("cpu")


class SavesCopy(torch.autograd.Function):
    """``x @ w.T`` that saves a contiguous copy of ``w.T`` for its backward (as a compiled
    block keeping the unsharded weight would)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        wt = w.t().contiguous()
        ctx.save_for_backward(x, wt)
        return x @ wt

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, wt = ctx.saved_tensors
        return grad @ wt.t(), (x.t() @ grad).t()


def _forward(layer: nn.Linear, x: torch.Tensor, run: Any) -> tuple[Any, torch.Tensor]:
    ledger = Ledger(CPU, resizes=True)
    weights = {n: p.detach().clone() for n, p in layer.named_parameters()}
    before = held.before_forward(ledger)
    with ledger.phase():
        out = run(x)
    return held.forward_held(out, layer.parameters(), ledger, before, weights), out


def test_what_the_autograd_graph_saves_is_held_by_it() -> None:
    layer, x = nn.Linear(16, 8), torch.randn(4, 16, requires_grad=True)
    found, out = _forward(layer, x, lambda x: torch.tanh(layer(x)))
    # tanh saves its result, the output (4x8 float32); the linear's output is freed, and its
    # saved input and weight were allocated before the forward
    assert (found.alive, found.graph, found.unheld, found.copies) == (4 * 8 * 4, 4 * 8 * 4, [], {})
    del out


def test_a_tensor_kept_beyond_the_graph_is_unheld() -> None:
    layer, x = nn.Linear(16, 8), torch.randn(4, 16)
    cache: list[torch.Tensor] = []

    def run(x: torch.Tensor) -> torch.Tensor:
        hidden = layer(x)
        cache.append(hidden * 2)  # a cache: alive, read by nothing the backward runs
        return hidden.sum()

    found, out = _forward(layer, x, run)
    assert found.unheld == [4 * 8 * 4]
    assert found.alive - found.graph == 4 * 8 * 4
    del out


def test_a_copy_of_a_parameter_saved_for_the_backward_is_named() -> None:
    layer, x = nn.Linear(16, 8, bias=False), torch.randn(4, 16)
    found, out = _forward(layer, x, lambda x: SavesCopy.apply(x, layer.weight))
    assert found.copies == {"weight": 8 * 16 * 4}
    assert found.unheld == []  # held by the graph: a copy, not a leak
    del out


def test_a_constant_parameter_is_never_taken_for_a_copy() -> None:
    layer, x = nn.Linear(16, 8, bias=False), torch.randn(4, 16)
    with torch.no_grad():
        layer.weight.fill_(1.0)  # a norm's ones: any tensor of ones would match
    found, out = _forward(layer, x, lambda x: SavesCopy.apply(x, layer.weight))
    assert found.copies == {}
    del out


def test_nothing_is_read_where_the_ledger_counts_no_storages() -> None:
    ledger = Ledger(CPU, measured=False)
    assert held.before_forward(ledger) is None
    assert held.forward_held(torch.ones(2), iter(()), ledger, None, {}) is None

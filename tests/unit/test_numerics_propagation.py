"""What the numerics area allows an update to move when gradients are off by as much as
eager's (``numerics.propagation.propagated``), held against torch's own optimizers: perturbing one step's
gradient by its allowance moves torch's update by no more than the allowance says, and by
about as much where the perturbation is small (the bound is first order, not a guess)."""

from __future__ import annotations

import pytest
import torch

from conformance.checks.numerics import propagation, tolerances
from conformance.checks.record import ParametersAfter, StepRecord, TrainedStep
from fixtures.optimizers import OPTIMIZERS

DTYPE = torch.bfloat16


def _step(optimizer: str, twin: torch.Tensor, eager: torch.Tensor) -> StepRecord:
    empty = ParametersAfter(thunder={}, eager_model={})
    return StepRecord(
        optimizer=optimizer,
        output=torch.zeros(1),
        grads={},
        eager=TrainedStep(output=torch.zeros(1), grads={"w": eager}),
        after=empty,
        twin=TrainedStep(output=torch.zeros(1), grads={"w": twin}),
    )


def _updates(name: str, grads: list[torch.Tensor]) -> torch.Tensor:
    """torch's update at the last of ``grads``, from a fresh optimizer, in float64."""
    p = torch.nn.Parameter(torch.zeros_like(grads[0], dtype=torch.float64))
    opt = OPTIMIZERS[name].make([p])
    for g in grads:
        before = p.detach().clone()
        p.grad = g.double().clone()
        opt.step()
    return p.detach() - before


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_a_gradient_off_by_its_allowance_moves_the_update_within_the_bound(name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    # gradients whose elements nearly cancel across steps in places: where AdamW amplifies
    grads = [torch.randn(64, generator=gen, dtype=torch.float64) for _ in range(3)]
    grads[1][:8] = -grads[0][:8] * 0.98
    eager = [g + 1e-3 * torch.randn(64, generator=gen, dtype=torch.float64) for g in grads]
    stage = [_step(name, g, e) for g, e in zip(grads, eager, strict=True)]
    bound = propagation.propagated(OPTIMIZERS[name], stage, "w", DTYPE)
    assert bound is not None and bound.shape == (64,)
    allowances = [tolerances.gradient_allowance(s, "w", DTYPE) for s in stage]
    exact = _updates(name, grads)
    for sign in (1.0, -1.0):
        for j in range(len(grads)):  # one step's gradient off by its whole allowance
            off = [g + sign * a if i == j else g for i, (g, a) in enumerate(zip(grads, allowances, strict=True))]
            moved = (_updates(name, off) - exact).abs()
            assert (moved <= bound * 1.05 + 1e-15).all(), (j, (moved / bound).max())
    # every step off at once, each by a tenth of its allowance: first order, so close to the bound
    tenth = [g + a / 10 * torch.sign(g) for g, a in zip(grads, allowances, strict=True)]
    moved = (_updates(name, tenth) - exact).abs()
    assert moved.norm() <= bound.norm() / 10 * 1.05


def test_a_skipped_step_still_moves_the_update_past_the_bound() -> None:
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(256, generator=gen, dtype=torch.float64) for _ in range(2)]
    eager = [g * (1 + 4e-3 * torch.randn(256, generator=gen, dtype=torch.float64)) for g in grads]
    stage = [_step("AdamW", g, e) for g, e in zip(grads, eager, strict=True)]
    bound = propagation.propagated(OPTIMIZERS["AdamW"], stage, "w", DTYPE)
    # the whole update is what a skipped step is off by
    assert _updates("AdamW", grads).norm() > 5 * bound.norm()


def test_a_missing_gradient_allows_nothing() -> None:
    step = _step("SGD", torch.ones(3), torch.ones(3))
    step.twin = None
    assert propagation.propagated(OPTIMIZERS["SGD"], [step], "w", DTYPE) is None
    assert tolerances.gradient_allowance(_step("SGD", torch.ones(3), torch.ones(2)), "w", DTYPE) is None

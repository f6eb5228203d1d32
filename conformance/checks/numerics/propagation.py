"""Numerics' tolerance for each step's update (parameters after less before) below float32.

Each step's update is held as a whole against the twin's update, the same way as the other
tensors (``conformance.checks.numerics.tolerances``), the rounding of both endpoints as its
floor, plus what the optimizer makes of gradients that are each off by as much as eager's
own (``EAGER_ERROR_FACTOR`` x eager's error per element, or the dtype's rounding of the
twin's gradient): AdamW divides by the gradients' running root mean square, so where an
element's gradients nearly cancel, an error well inside the gradient's tolerance moves its
update by a large fraction. The allowance is the optimizer's first-order sensitivity to each
step's gradient (``propagated``), computed from the twin's gradients and the optimizer's
hyperparameters. A skipped step or an update applied twice still moves the update by its
whole size.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.checks.derived import printed
from conformance.checks.findings import Findings, strict_unless_finite
from conformance.checks.numerics.tolerances import EAGER_ERROR_FACTOR, Tensors, gradient_allowance, rounding
from conformance.checks.record import ParametersAfter, StepRecord
from fixtures.optimizers import OPTIMIZERS, Optimizer


# calibrated on a measurement: without it ci's litgpt_neox ZERO3 bfloat16 cell moved a norm_2.bias update by 15% at
# AdamW's second step, from gradients that passed (2026-11-22):
# docs/measurements.md#numerics-the-cells-behind-the-allowances
def propagated(
    optimizer: Optimizer, stage: list[StepRecord], n: str, dtype: torch.dtype, world: int | None = None
) -> torch.Tensor | None:
    """Per element, how far the update of the last step of ``stage`` (the steps of one fresh
    optimizer so far) moves, to first order, when each step's gradient is off by its
    ``gradient_allowance``. SGD: lr x the allowance. AdamW, with r = m^/(sqrt(v^) + eps) and
    c1_j, c2_j the bias-corrected weights of step j's gradient in m^ and v^:
    |dr/dg_j| <= c1_j / (sqrt(v^) + eps) + |m^| c2_j |g_j| / (sqrt(v^) (sqrt(v^) + eps)^2)."""
    allowances = [gradient_allowance(s, n, dtype, world) for s in stage]
    grads = [s.twin.grads.get(n) if s.twin is not None else None for s in stage]
    if any(a is None for a in allowances) or any(g is None for g in grads):
        return None
    if optimizer.name == "SGD":
        return optimizer.lr * allowances[-1]
    b1, b2 = optimizer.betas
    a = len(stage)
    c1 = [(1 - b1) * b1 ** (a - j) / (1 - b1**a) for j in range(1, a + 1)]
    c2 = [(1 - b2) * b2 ** (a - j) / (1 - b2**a) for j in range(1, a + 1)]
    g = [t.double() for t in grads]
    m = sum(c * t for c, t in zip(c1, g, strict=True))
    root = sum(c * t * t for c, t in zip(c2, g, strict=True)).sqrt()
    d = root + optimizer.eps
    # where every gradient so far is exactly zero, v^ is too: only the first term remains
    second = torch.where(root > 0, m.abs() / (root * d * d).clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    sensitivity = sum(
        al * (c / d + second * c2_j * gj.abs()) for al, c, c2_j, gj in zip(allowances, c1, c2, g, strict=True)
    )
    return optimizer.lr * sensitivity


def propagated_per_parameter(stage: list[StepRecord], twin: Tensors, dtype: torch.dtype, world: int) -> Tensors:
    """``propagated`` for every parameter of the twin that has one (of its shape)."""
    optimizer = OPTIMIZERS[stage[-1].optimizer]
    out = {}
    for n, g in twin.items():
        m = propagated(optimizer, stage, n, dtype, world)
        if m is not None and m.shape == g.shape:
            out[n] = m
    return out


def judge_update(
    found: Findings, k: int, stage: list[StepRecord], before: ParametersAfter, dtype: torch.dtype, moved: Tensors
) -> bool:
    """Each parameter's update at step ``k`` (the last of ``stage``) against the twin's, as
    whole tensors; ``moved``: per parameter, ``propagated`` at this step."""
    failures = len(found.failures)
    worst = 0.0
    step = stage[-1]
    after, optimizer = step.after, OPTIMIZERS[step.optimizer]
    for n, g_after in (after.twin or {}).items():
        derived: dict[str, float] = {}  # filled as the check derives it: a failure before names none
        fields: dict[str, Any] = {"step": k, "optimizer": optimizer.name, "name": n}  # the distance once known
        with found.expect("numerics.update", f"update at step {k} ({optimizer.name}) [{n}]", derived, fields):
            t_after, t_before = after.thunder.get(n), before.thunder.get(n)
            assert t_after is not None and t_before is not None, "missing"
            assert t_after.shape == g_after.shape, f"shape {tuple(t_after.shape)}, expected {tuple(g_after.shape)}"
            g_before = before.twin[n].double() if before.twin is not None else None
            assert g_before is not None, "the twin's parameters before the step are missing"
            twin = g_after.double() - g_before
            thunder = t_after.double() - t_before.double()
            eager = after.eager_model[n].double() - before.eager_model[n].double()
            thunder_err = (thunder - twin).norm().item()
            eager_err = (eager - twin).norm().item()
            floor = (rounding(g_after, dtype).norm() + rounding(g_before, dtype).norm()).item()
            allowed = moved[n].norm().item() if n in moved else 0.0
            bound = EAGER_ERROR_FACTOR * max(eager_err, floor) + allowed
            bound = strict_unless_finite(bound)
            derived.update(
                twin_size=printed(twin.norm().item()),
                eager_distance=printed(eager_err),
                rounding=printed(floor),
                optimizer_allowance=printed(allowed),
                bound=printed(bound),
            )
            fields["distance"] = printed(thunder_err)
            worst = max(worst, thunder_err / bound if bound else (0.0 if thunder_err == 0 else float("inf")))
            assert thunder_err == thunder_err and thunder_err <= bound, (
                f"the update is {thunder_err:.3g} away from the float32 twin's (size {twin.norm().item():.3g}); "
                f"eager's is {eager_err:.3g} away, the dtype's rounding {floor:.3g}, what the optimizer makes of "
                f"gradients off as far as eager's {allowed:.3g}: bound {bound:.3g}"
            )
    found.metrics[f"update at step {k} distance / bound (worst)"] = worst
    return len(found.failures) == failures

"""Numerics' tolerances: how far the Thunder module's tensors may sit from eager's.

Float32 is held to fixed tolerances. Below float32, eager PyTorch is itself only an
approximation, so every tolerance comes from eager's own error against a float32 twin that
trains in lockstep from the same weights, or from the dtype itself, never a fixed number:
- per element, Thunder may differ from eager by ``EAGER_ERROR_FACTOR`` x the larger of
  eager's worst distance from the twin and the dtype's worst rounding of the twin's values,
  plus one unit of the dtype's relative spacing (``torch.finfo(dtype).eps``: two results
  rounded from nearly equal values may differ in their last bit);
- as a whole (2-norm per tensor), Thunder's distance from the twin is at most
  ``EAGER_ERROR_FACTOR`` x eager's (or x the dtype's rounding of the twin): a gradient
  scaled by 1% moves it by 1% of its size, about four times bfloat16's rounding.
Each step's update is held the same way, with what the optimizer makes of gradients off as
far as these allow on top (``conformance.checks.numerics.propagation``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from conformance.checks.derived import printed
from conformance.checks.findings import Findings, strict_unless_finite
from conformance.checks.record import RankGradients, StepRecord

Tensors = dict[str, torch.Tensor]

# assert_close tolerances for float32: sharded reductions sum in another order than eager,
# and the optimizer steps compound it, so they sit a little above assert_close's defaults.
# calibrated on a measurement: ci's worst float32 error, 5.7e-6 on a litgpt_neox output (2026-11-22):
# docs/measurements.md#numerics-the-cells-behind-the-allowances
FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}
TENSOR = "numerics.tensor"  # a tensor off from eager's beyond the tolerance (or missing, or misshapen)
EAGER_ERROR_FACTOR = 2.0


def compare(
    found: Findings,
    what: str,
    actual: Tensors,
    expected: Tensors,
    twin: Tensors | None,
    dtype: torch.dtype,
    drift: Tensors | None = None,
    local: Local | None = None,
    roundings: int = 1,
    fields: Mapping[str, Any] | None = None,
    fixed: bool | None = None,
) -> bool:
    """Tensors of one kind against eager's (failures ``numerics.tensor`` per element and
    ``numerics.distance`` as a whole, with ``fields`` and the tensor's name): in float32 at
    FLOAT32; below it per element from eager's own error against the float32 twin ``twin`` (plus the worst element of
    ``drift``, per name), and each tensor as a whole (plus the norm of ``drift``). ``local``:
    gradients eager computed per rank beside their twin, whose error counts as eager's too.
    ``fixed``: FLOAT32's tolerances (None: where ``dtype`` is float32; a float32 tensor computed
    below it, FSDP2's mixed precision's parameters, is held to eager's error instead)."""
    if (dtype == torch.float32) if fixed is None else fixed:
        return found.close(TENSOR, what, actual, expected, fields=fields, **FLOAT32)
    per_name = eager_error(expected, twin, dtype, local, roundings)
    for n, d in (drift or {}).items():
        if n in per_name:
            per_name[n]["atol"] += d.max().item()
    ok = found.close(TENSOR, what, actual, expected, per_name, fields, rtol=torch.finfo(dtype).eps, atol=0.0)
    return _as_whole(found, what, actual, expected, twin or {}, dtype, drift, local, roundings, fields) and ok


# calibrated on a measurement: nightly's bfloat16 cells failed by 1.01 to 3 x their bounds without the
# reduction's roundings, more at 3 and 4 ranks (2026-11-23):
# docs/measurements.md#numerics-the-cells-behind-the-allowances
@dataclasses.dataclass(frozen=True)
class Local:
    """Gradients as data-parallel ranks compute them before reducing: eager's gradient of each
    rank's own loss in the cell's dtype (``ranks``: their mean and mean magnitude) and the
    float32 twin's at the same weights (``twin``). A reduction rounds each rank's gradient to
    the dtype and then every partial sum, where eager's gradient of the averaged loss rounds
    once. So Thunder may stray EAGER_ERROR_FACTOR x the larger of eager's error and the
    per-rank mean's (which holds the ranks' roundings), plus what the reduction's own
    roundings can add: ``reduction`` (it matters where a sum's terms nearly cancel, a bias's
    or a BatchNorm's, and grows with the number of ranks)."""

    ranks: RankGradients
    twin: Tensors
    additions: int  # the reduction's: world - 1 (and an accumulation's, one per micro-step more)
    dtype: torch.dtype

    @classmethod
    def of(cls, ranks: RankGradients | None, twin: Tensors | None, additions: int, dtype: torch.dtype) -> Local | None:
        return None if ranks is None or twin is None else cls(ranks, twin, additions, dtype)

    def error(self, n: str) -> torch.Tensor | None:
        """Per element, the per-rank mean's distance from the twin (None where either lacks
        ``n`` or their shapes differ)."""
        e, g = self.ranks.mean.get(n), self.twin.get(n)
        if e is None or g is None or e.shape != g.shape or not e.numel():
            return None
        return (e.double() - g.double()).abs()

    def reduction(self, n: str) -> torch.Tensor | None:
        """Per element, the most the reduction's roundings move the mean: its additions (world
        - 1, and one per micro-step accumulated), each rounding a partial sum of at most the
        ranks' magnitudes (mean units), and the division by the world size, u = eps / 2 each:
        u (additions A + |mean|)."""
        a, m = self.ranks.magnitude.get(n), self.ranks.mean.get(n)
        if a is None or m is None or a.shape != m.shape:
            return None
        u = torch.finfo(self.dtype).eps / 2
        return u * (self.additions * a + m.abs())


def named_output(twin: torch.Tensor | None) -> Tensors | None:
    return None if twin is None else {"output": twin}


def rounding(twin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """How far the twin's float32 values move when stored in ``dtype``: the error even an
    exact computation in ``dtype`` has."""
    g = twin.double()
    return (g.to(dtype).double() - g).abs()


def eager_error(
    expected: Tensors, twin: Tensors | None, dtype: torch.dtype, local: Local | None = None, roundings: int = 1
) -> dict[str, dict[str, float]]:
    """Per-name atol: EAGER_ERROR_FACTOR x the largest of eager's own distance from the float32
    twin, per-rank eager's (``local``) and the dtype's rounding of the twin (each per element,
    the worst element; the rounding taken ``roundings`` times), plus the reduction's worst
    rounding (``Local.reduction``)."""
    if twin is None:
        return {}
    out = {}
    for n, e in expected.items():
        g = twin.get(n)
        if g is None or g.shape != e.shape or not e.is_floating_point() or not e.numel():
            continue
        eager = (e.double() - g.double()).abs().max().item()
        per_rank = local.error(n) if local is not None else None
        reduction = local.reduction(n) if local is not None else None
        floor = roundings * rounding(g, dtype).max().item()
        worst = max(eager, per_rank.max().item() if per_rank is not None else 0.0, floor)
        reduced = reduction.max().item() if reduction is not None and reduction.numel() else 0.0
        out[n] = {"atol": EAGER_ERROR_FACTOR * worst + reduced}
    return out


def _as_whole(
    found: Findings,
    what: str,
    actual: Tensors,
    expected: Tensors,
    twin: Tensors,
    dtype: torch.dtype,
    extra: Tensors | None = None,
    local: Local | None = None,
    roundings: int = 1,
    fields: Mapping[str, Any] | None = None,
) -> bool:
    """Each tensor as a whole: its distance (2-norm) from the float32 twin at most
    EAGER_ERROR_FACTOR x eager's (or per-rank eager's, ``local``), or x the dtype's rounding
    of the twin (``roundings`` times) where that is larger, plus the norm of the reduction's
    roundings (``local``) and of ``extra`` (per element; parameters: the drift the optimizer's
    steps allow). A systematic error (a scale, a skipped term) that no single element shows
    fails here."""
    failures = len(found.failures)
    worst = 0.0
    for n, g in twin.items():
        t, e = actual.get(n), expected.get(n)
        if t is None or e is None or t.shape != g.shape or not g.is_floating_point():
            continue  # reported by the elementwise comparison
        thunder_err = (t.double() - g.double()).norm().item()
        eager_err = (e.double() - g.double()).norm().item()
        per_rank = local.error(n) if local is not None else None
        if per_rank is not None and per_rank.shape == g.shape:
            eager_err = max(eager_err, per_rank.norm().item())
        bound = EAGER_ERROR_FACTOR * max(eager_err, roundings * rounding(g, dtype).norm().item())
        reduction = local.reduction(n) if local is not None else None
        if reduction is not None and reduction.shape == g.shape:
            bound += reduction.norm().item()
        if extra is not None and n in extra and extra[n].shape == g.shape:
            bound += extra[n].norm().item()
        bound = strict_unless_finite(bound)
        worst = max(worst, thunder_err / bound if bound else (0.0 if thunder_err == 0 else float("inf")))
        size = g.double().norm().item()
        derived = {"twin_size": printed(size), "eager_distance": printed(eager_err), "bound": printed(bound)}
        where = {**(fields or {}), "name": n, "distance": printed(thunder_err)}
        with found.expect("numerics.distance", f"{what} [{n}] as a whole", derived, where):
            assert thunder_err <= bound, (
                f"{thunder_err:.3g} away from the float32 twin (size {size:.3g}); "
                f"eager is {eager_err:.3g} away: bound {bound:.3g}"
            )
    found.metrics[f"{what} distance / bound (worst)"] = worst
    return len(found.failures) == failures


# calibrated on a measurement: root_owned bfloat16 failed gradients at step 3 [norm.bias] by 1.49 x its bound
# without this term (2026-11-22): docs/measurements.md#numerics-the-cells-behind-the-allowances
def drift_effect(at_thunder: Tensors | None, twin: Tensors | None) -> Tensors | None:
    """Per name and element, how far the twin's result at the Thunder module's weights sits
    from the twin's at its own: what the weights' drift (allowed) makes of the result."""
    if at_thunder is None or twin is None:
        return None
    return {
        n: (t.double() - twin[n].double()).abs()
        for n, t in at_thunder.items()
        if n in twin and t.shape == twin[n].shape and t.is_floating_point()
    }


def gradient_allowance(step: StepRecord, n: str, dtype: torch.dtype, world: int | None = None) -> torch.Tensor | None:
    """Per element, how far Thunder's gradient of ``n`` may sit from the twin's at ``step``
    as eager's does: EAGER_ERROR_FACTOR x the larger of eager's distance and the dtype's
    rounding of the twin's gradient (given ``world``, per-rank eager's distance too, and the
    reduction's roundings on top: ``Local``), plus what the weights' drift makes of the
    gradient (None where eager's or the twin's is missing: no allowance)."""
    twin, at_thunder = step.twin, step.twin_at_thunder
    g = twin.grads.get(n) if twin is not None else None
    e = step.eager.grads.get(n)
    if g is None or e is None or g.shape != e.shape:
        return None
    error = (e.double() - g.double()).abs()
    at_thunder_grads = at_thunder.grads if at_thunder is not None else None
    local = Local.of(step.local_at_thunder, at_thunder_grads, world - 1, dtype) if world else None
    per_rank = local.error(n) if local is not None else None
    if per_rank is not None and per_rank.shape == g.shape:
        error = torch.maximum(error, per_rank)
    allowance = EAGER_ERROR_FACTOR * torch.maximum(error, rounding(g, dtype))
    reduction = local.reduction(n) if local is not None else None
    if reduction is not None and reduction.shape == g.shape:
        allowance = allowance + reduction
    effect = (drift_effect(at_thunder_grads, twin.grads if twin is not None else None) or {}).get(n)
    return allowance if effect is None else allowance + effect

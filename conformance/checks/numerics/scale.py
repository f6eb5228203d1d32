"""Numerics' judgement of a gradient's scale: a gradient off by a scale that the elementwise
tolerances hide (eager's rounding below float32, the fixed atol in float32), against eager's
gradients of each rank's own loss."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from conformance.checks.findings import Findings
from conformance.checks.numerics.tolerances import Tensors
from conformance.checks.record import RankGradients
from conformance.matrix.cells import Cell
from fixtures import patterns
from fixtures.models import MODELS

# how many standard deviations of the roundings' own scatter a gradient's scale may stray
# from eager's at the same weights: with a margin over the worst the pinned Thunder shows
# calibrated on a measurement: at worst 4.1 deviations (0.69 of the bound, a litgpt_neox matrix) over ci's 19 and
# nightly's first 108 bfloat16 cells (2026-11-23): docs/measurements.md#numerics-the-cells-behind-the-allowances
SCALE_DEVIATIONS = 6.0
SCALE_MIN_ELEMENTS = 64  # a tensor judged alone needs this many elements to estimate its scatter
# T - S holds two local computations' roundings, Thunder's and eager's, each as large as eager's
# own against the reference: their variances add
# calibrated on a measurement: twice eager's deviation lost gradient_off_on_last_rank (0.94 of the bound) and the
# float32 ulp (0.87); with sqrt 2 they read 1.13 and 1.21 (2026-11-25):
# docs/measurements.md#back-to-back--x-on-ci-the-float32-gradient-scale-2026-11-25-third-session
IMPLEMENTATIONS = 2


def scale_constants(cell: Cell) -> list[float]:
    """The constants that scale every gradient of ``cell`` on its way, which an implementation
    may round in the cell's dtype or not: 1/world_size (averaging over the ranks) and the
    model's dropout scale 1/(1 - p)."""
    constants = [1.0 / cell.world_size]
    fixture = MODELS.get(cell.model)
    if fixture is not None and fixture.output_dropout is not None:
        constants.append(1.0 / (1.0 - fixture.output_dropout))
    return constants


def judge_gradient_scale(
    found: Findings,
    what: str,
    actual: Tensors,
    local: RankGradients,
    reference: Tensors,
    dtype: torch.dtype,
    constants: list[float],
    additions: int,
    world: int = 1,
    fields: Mapping[str, Any] | None = None,
) -> bool:
    """A gradient off by a scale that the elementwise comparison hides (1% is about one
    bfloat16 rounding; in float32 an error of 1e-4 on gradients of 0.1 sits at its atol), on
    any step. ``local``: eager's gradients of each rank's own loss at the weights the Thunder
    module held as the step began, in the cell's dtype, averaged exactly: S, what the ranks
    hand their reduction. Thunder's reduced gradient T differs from S by roundings (the
    reduction's, its local computation's), which round to nearest and so do not point along
    the gradient: the scale a = <T - S, S> / <S, S> is zero but for their scatter.

    That scatter comes from eager, never from T: ``reference`` is the same gradient one
    precision up (the float32 twin's below float32, float64 in float32), so S's residuals
    r = S - R - b R are what the dtype's roundings did to eager's local computation, and
    sd(a)^2 = IMPLEMENTATIONS (sum over units of (sum over the unit of r * S)^2) / <S, S>^2
    plus the reduction's own roundings: u (``additions`` x the ranks' mean magnitude + |S|)
    per element, ``additions`` being the world size less one.
    The units are a tensor's elements plus, for a matrix, its rows and its columns, because a
    rounded upstream gradient spreads along a row of a Linear's weight gradient and a rounded
    activation along a column. Allowed on top: what rounding each of ``constants``
    (``scale_constants``) in the dtype changes it by. Judged over all gradients together,
    per matrix of at least SCALE_MIN_ELEMENTS elements and over each of the ``world`` ranks'
    rows of the matrices (unless all are off; ``world`` 1 where no rank holds a shard)."""
    systematic = sum(abs(torch.tensor(c, dtype=dtype).double().item() / c - 1.0) for c in constants)
    u = torch.finfo(dtype).eps / 2
    pairs: dict[str, tuple[torch.Tensor, ...]] = {}
    for n, s in local.mean.items():
        t, r, m = actual.get(n), reference.get(n), local.magnitude.get(n)
        if t is None or t.shape != s.shape or not t.is_floating_point() or not bool(t.isfinite().all()):
            continue  # reported by the elementwise comparison
        if r is None or r.shape != s.shape or m is None or m.shape != s.shape or not s.numel():
            continue  # the kit's own: computed beside every step
        # the reduction's roundings: world - 1 additions of terms up to the ranks' magnitude
        reduction = u * (additions * m.double() + s.double().abs())
        pairs[n] = (_rows(t), _rows(s), _rows(r), _rows(reduction))
    failures = len(found.failures)
    worst = 0.0
    # a tensor alone: a matrix, whose rows and columns bound how its roundings are shared (a
    # vector's, a bias summed over the batch, are shared in ways its elements cannot show):
    # vectors count in "all" only
    groups = {"all": list(pairs.values())} | {
        n: [pair] for n, pair in pairs.items() if pair[1].shape[1] > 1 and pair[1].numel() >= SCALE_MIN_ELEMENTS
    }
    # each rank's rows of every gradient (dim 0 split as FSDP shards it, padded): a bug in
    # one rank's share of the reduction (a scale on its shard alone) shows there at full size
    for k in range(world if world > 1 else 0):
        share = []
        for pair in pairs.values():
            c = patterns.chunk_rows(len(pair[1]), world)  # the rows of a shard
            rows = slice(k * c, (k + 1) * c)
            if pair[1].shape[1] > 1 and len(pair[1][rows]):  # matrices only, as above
                share.append(tuple(x[rows] for x in pair))
        groups[f"rank {k}'s rows"] = share
    judged: dict[str, tuple[float, float, float]] = {}  # label -> (scale, sd, bound)
    for label, members in groups.items():
        size = sum(float((s * s).sum()) for _, s, _, _ in members)
        if size == 0.0 or sum(s.numel() for _, s, _, _ in members) < SCALE_MIN_ELEMENTS:
            continue
        scale = sum(float(((t - s) * s).sum()) for t, s, _, _ in members) / size
        # eager's own scale against the reference (b): its residuals are what scatters
        norm = sum(float((r * r).sum()) for _, _, r, _ in members)
        own = sum(float(((s - r) * r).sum()) for _, s, r, _ in members) / norm if norm else 0.0
        scatter = 0.0
        for _, s, r, reduction in members:
            x = (s - r - own * r) * s
            scatter += IMPLEMENTATIONS * float((x * x).sum())
            if x.shape[1] > 1:  # a matrix: its rows and its columns too
                scatter += IMPLEMENTATIONS * (float((x.sum(1) ** 2).sum()) + float((x.sum(0) ** 2).sum()))
            scatter += float(((reduction * s) ** 2).sum())
        sd = math.sqrt(scatter) / size
        judged[label] = (scale, sd, systematic + SCALE_DEVIATIONS * sd)
    off = {label for label, (scale, _, bound) in judged.items() if not abs(scale) <= bound}
    tensors = {label for label in judged if label != "all" and not label.startswith("rank ")}
    if "all" in off and tensors and tensors <= off:
        off -= tensors  # every tensor off: each would say what "all" says (a rank's rows name the rank)
    for label, (scale, sd, bound) in judged.items():
        worst = max(worst, abs(scale) / bound if bound else (0.0 if scale == 0 else float("inf")))
        if label == "all":
            found.metrics[f"{what} (all gradients)"] = {"scale": 1 + scale, "bound": bound}
        if label not in off:
            continue
        with found.expect("numerics.gradient_scale", f"{what} [{label}]", fields=fields, group=label):
            raise AssertionError(
                f"Thunder's gradients are {_factor(scale)} x eager's at the same weights (each rank's own in "
                f"{str(dtype).removeprefix('torch.')}, averaged); eager's roundings scatter that by {sd:.2e}: "
                f"at most 1 +- {bound:.2e} ({SCALE_DEVIATIONS:g} of those"
                + (f", plus {systematic:.2e} from scale constants rounded in that dtype)" if systematic else ")")
            )
    found.metrics[f"{what} |scale| / bound (worst)"] = worst
    return len(found.failures) == failures


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64 as a matrix of its rows (dim 0 by the rest; a vector: one column)."""
    return t.double().reshape(t.shape[0] if t.dim() else 1, -1)


def _factor(scale: float) -> str:
    """1 + ``scale`` as a reader tells it from 1: five decimals, or the difference itself where
    those would read 1.00000 (float32's roundings are about 1e-7)."""
    if abs(scale) >= 1e-5 or not math.isfinite(scale):
        return f"{1 + scale:.5f}"
    return f"(1 {'-' if scale < 0 else '+'} {abs(scale):.2e})"

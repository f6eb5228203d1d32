"""Numerics' judgement of a gradient's scale: a gradient off by a scale that the elementwise
tolerances hide (eager's rounding below float32, the fixed atol in float32), against eager's
gradients of each rank's own loss."""

from __future__ import annotations

import math

import torch

from conformance.checks.findings import Findings
from conformance.checks.numerics.tolerances import Tensors
from conformance.matrix.cells import Cell
from fixtures import patterns
from fixtures.models import MODELS

# how many standard deviations of the roundings' own scatter a gradient's scale may stray
# from eager's at the same weights: with a margin over the worst the pinned Thunder shows
SCALE_DEVIATIONS = 6.0
SCALE_MIN_ELEMENTS = 64  # a tensor judged alone needs this many elements to estimate its scatter


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
    local: Tensors,
    dtype: torch.dtype,
    constants: list[float],
    world: int = 1,
) -> bool:
    """A gradient off by a scale that the elementwise comparison hides (1% is about one
    bfloat16 rounding; in float32 an error of 1e-4 on gradients of 0.1 sits at its atol), on
    any step. ``local``: eager's gradients of each rank's
    own loss at the weights the Thunder module held as the step began, in the cell's dtype,
    averaged exactly: what the ranks hand their reduction. Thunder's reduced gradient T
    differs from that S by the reduction's roundings and its local computation's, which round
    to nearest and so do not point along the gradient: the scale a = <T - S, S> / <S, S> is
    zero but for their scatter, which the residuals r = T - S - a S estimate:
    sd(a)^2 = sum over units of (sum over the unit of r * S)^2 / <S, S>^2, the units being a
    tensor's elements, plus (for a matrix) its rows and its columns, because a rounded
    upstream gradient spreads along a row of a Linear's weight gradient and a rounded
    activation along a column. Allowed on top: what rounding each of ``constants``
    (``scale_constants``) in the dtype changes it by. Judged over all gradients together,
    per matrix of at least SCALE_MIN_ELEMENTS elements and over each of the ``world`` ranks'
    rows of the matrices (unless all are off; ``world`` 1 where no rank holds a shard)."""
    systematic = sum(abs(torch.tensor(c, dtype=dtype).double().item() / c - 1.0) for c in constants)
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for n, s in local.items():
        t = actual.get(n)
        if t is None or t.shape != s.shape or not t.is_floating_point() or not bool(t.isfinite().all()):
            continue  # reported by the elementwise comparison
        if not s.numel():
            continue
        pairs[n] = (_rows(t), _rows(s))
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
    for r in range(world if world > 1 else 0):
        share = []
        for t, s in pairs.values():
            c = patterns.chunk_rows(len(s), world)  # the rows of a shard
            rows = slice(r * c, (r + 1) * c)
            if s.shape[1] > 1 and len(s[rows]):  # matrices only, as above
                share.append((t[rows], s[rows]))
        groups[f"rank {r}'s rows"] = share
    for label, members in groups.items():
        size = sum(float((s * s).sum()) for _, s in members)
        if size == 0.0 or sum(s.numel() for _, s in members) < SCALE_MIN_ELEMENTS:
            continue
        scale = sum(float(((t - s) * s).sum()) for t, s in members) / size
        scatter = 0.0
        for t, s in members:
            x = (t - s - scale * s) * s
            scatter += float((x * x).sum())
            if x.shape[1] > 1:  # a matrix: its rows and its columns too
                scatter += float((x.sum(1) ** 2).sum()) + float((x.sum(0) ** 2).sum())
        sd = math.sqrt(scatter) / size
        bound = systematic + SCALE_DEVIATIONS * sd
        worst = max(worst, abs(scale) / bound if bound else (0.0 if scale == 0 else float("inf")))
        if label == "all":
            found.metrics[f"{what} (all gradients)"] = {"scale": 1 + scale, "bound": bound}
        elif len(found.failures) > failures and not label.startswith("rank "):
            continue  # off already: each tensor's scale would say it again (a rank's names the rank)
        with found.expect(f"{what} [{label}]"):
            assert abs(scale) <= bound, (
                f"Thunder's gradients are {_factor(scale)} x eager's at the same weights (each rank's own in "
                f"{str(dtype).removeprefix('torch.')}, averaged); the roundings scatter that by {sd:.2e}: "
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

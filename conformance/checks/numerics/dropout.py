"""Numerics' judgement of a dropout that is the model's last op, from every rank's masks over
the training steps: its rate, and its masks' structure (each element drawn on its own, a new
mask every step, a different one on every rank)."""

from __future__ import annotations

import math

import torch

from conformance.checks.distributions import ALPHA, _z
from conformance.checks.findings import Findings

# the rate's two-sided test at ALPHA: with the masks of dropout_head (240 rows x 15 outputs x 6
# steps per rank; all ranks pooled, or one rank's where the ranks draw one mask) a rate 0.02
# off 0.25 is found with probability 0.99 or more
RATE_Z = _z(ALPHA / 2)
# the dispersion tests' bound in standard deviations: their statistics are sums of many
# independent terms (normal in the limit, slightly right-skewed), so a false alarm well under
# ALPHA, and rows or columns dropped together exceed it many times over
DISPERSION_Z = 6.0


def judge_dropout(found: Findings, masks: list[list[torch.Tensor]], p: float, seeded_apart: bool = True) -> None:
    """``masks[step][rank]``: True where kept (the eager models replayed them, so outputs and
    gradients were compared exactly). Pooled over steps and ranks they drop p of the elements
    (a z-test at ALPHA); the dropped counts of each mask's rows and columns scatter as
    independent draws do (a chi-square-like dispersion test: rows or columns dropped
    together); and no two masks, of two steps or of two ranks, agree more than independent
    draws do (a new mask every step, not one replayed nor two alternating, and one per rank).
    ``seeded_apart``: whether the kit seeded the ranks' generators differently; where it did
    not, eager PyTorch would draw one mask on every rank too, so ranks' masks are not compared,
    and a mask equal to a lower rank's at the same step counts once (not as more evidence)."""
    if not seeded_apart:
        masks = [[m for r, m in enumerate(ms) if not any(torch.equal(m, o) for o in ms[:r])] for ms in masks]
    flat = [
        (k, r, m.reshape(m.shape[0] if m.dim() > 1 else 1, -1)) for k, ms in enumerate(masks) for r, m in enumerate(ms)
    ]
    n = sum(m.numel() for *_, m in flat)
    if not n:
        return
    dropped = sum(int((~m).sum()) for *_, m in flat) / n
    bound = RATE_Z * math.sqrt(p * (1 - p) / n)
    found.metrics["dropout fraction dropped"] = {"measured": dropped, "p": p, "bound": bound, "values": n}
    with found.expect("numerics.dropout_fraction", "dropout fraction dropped"):
        assert abs(dropped - p) <= bound, (
            f"{dropped:.4f} of {n} outputs dropped over {len(masks)} steps and every rank, expected p = {p} within "
            f"{bound:.4f} ({RATE_Z:.2f} binomial standard deviations, a false alarm {ALPHA:g})"
        )
    for axis, what in ((1, "rows"), (0, "columns")):
        with found.expect("numerics.dropout_dispersion", f"dropout masks' {what}", along=what):
            _dispersion(flat, axis, dropped, what)
    _agreement(found, flat, seeded_apart)


def _dispersion(flat: list[tuple[int, int, torch.Tensor]], axis: int, q: float, what: str) -> None:
    """The dropped counts of every mask's rows (axis 1) or columns (axis 0), m elements each,
    standardized by the binomial(m, q) at the measured rate q: their squares sum to about the
    number of counts R, with variance R (2 + (1 - 6 q (1 - q)) / (m q (1 - q)))."""
    stat, count, var = 0.0, 0, 0.0
    for *_, m in flat:
        size = m.shape[axis]
        if size < 2 or not 0 < q < 1:
            continue
        c = (~m).sum(axis).double()
        spread = size * q * (1 - q)
        stat += float((((c - size * q) ** 2) / spread).sum())
        count += c.numel()
        var += c.numel() * (2 + (1 - 6 * q * (1 - q)) / spread)
    if count == 0:
        return
    z = (stat - count) / math.sqrt(var)
    assert z <= DISPERSION_Z, (
        f"the dropped counts of {count} mask {what} scatter {stat / count:.2f} x as widely as independent "
        f"draws do ({z:.1f} standard deviations, at most {DISPERSION_Z:g}): elements dropped together"
    )


def _agreement(found: Findings, flat: list[tuple[int, int, torch.Tensor]], across_ranks: bool) -> None:
    """Every pair of masks of one shape: their correlation phi over the elements, sqrt(n) phi
    about standard normal for independent draws; one-sided at ALPHA over all pairs."""
    pairs = len(flat) * (len(flat) - 1) // 2
    critical = _z(ALPHA / max(pairs, 1))
    failing: set[str] = set()
    for i, (k, r, a) in enumerate(flat):
        for s_, t, b in flat[:i]:
            label = f"dropout mask at step {k}" if r == t else f"dropout masks of ranks {t} and {r} at step {k}"
            if label in failing or a.shape != b.shape or (k != s_ and r != t):
                continue
            x, y = a.flatten().double(), b.flatten().double()
            if float(x.std()) == 0 or float(y.std()) == 0:
                continue  # a mask dropping nothing or everything: the rate's finding
            phi = float(torch.corrcoef(torch.stack([x, y]))[0, 1])
            z = phi * math.sqrt(x.numel())
            with found.expect("numerics.dropout_agreement", label, step=k, ranks=sorted({r, t})):
                if z > critical:
                    failing.add(label)
                other = f"step {s_}" if r == t else f"rank {t}"
                assert z <= critical, (
                    f"the mask agrees with {other}'s: correlation {phi:.3f} over {x.numel()} elements "
                    f"({z:.1f} standard deviations, at most {critical:.2f}): "
                    + ("the dropout did not draw anew" if r == t else "the ranks drew the same mask")
                )

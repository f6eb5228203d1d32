"""The power of module init's tests (``distributions.judge``) against the changes the kit
promises to detect: a std off by 20% either way and a mean shifted by 0.2 std, each with
probability ``POWER`` at a tensor's size. Computed, not simulated: the tests' null
distributions are exact (the uniform's mean test is bounded by its sub-Gaussian tail, and
the power given for it here ignores that test, leaving the bounds to find a shift), so
these are lower bounds up to the chi-square's exactness.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from conformance.checks.distributions import ALPHA, MEAN_Z, Dist, Z

POWER = 0.9
SCALES = (0.8, 1.2)  # a std off by 20%
SHIFT = 0.2  # a mean shifted by this many std


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _chi2_cdf(n: int, x: float) -> float:
    return torch.special.gammainc(torch.tensor(n / 2, dtype=torch.float64), torch.tensor(x / 2)).item()


def _chi2_quantile(n: int, p: float) -> float:
    lo, hi = 0.0, n + 200.0 * math.sqrt(2 * n) + 200.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _chi2_cdf(n, mid) < p else (lo, mid)
    return (lo + hi) / 2


def scale_power(kind: str, n: int, s: float) -> float:
    """Chance that ``n`` values drawn with their std scaled by ``s`` fail the scale test or
    the bounds."""
    if kind == "uniform":
        # narrower: every value within s of the half-width, rejected below ALPHA^(1/n);
        # wider: some value outside the bounds
        return min(1.0, ALPHA / s**n) if s < 1 else 1 - s ** (-n)
    lo, hi = _chi2_quantile(n, ALPHA / 2), _chi2_quantile(n, 1 - ALPHA / 2)
    chi2 = _chi2_cdf(n, lo / s**2) + 1 - _chi2_cdf(n, hi / s**2)
    outside = 1 - (1 - 2 * _phi(-Z / s)) ** n
    return min(1.0, max(chi2, outside))


def shift_power(kind: str, n: int, d: float) -> float:
    """Chance that ``n`` values with their mean shifted by ``d`` std fail the mean test or
    the bounds (a uniform: the bounds alone, d / √12 of its values land outside)."""
    if kind == "uniform":
        return 1 - (1 - d / math.sqrt(12)) ** n
    z = d * math.sqrt(n)
    return _phi(z - MEAN_Z["normal"]) + _phi(-z - MEAN_Z["normal"])


@dataclasses.dataclass(frozen=True)
class Powered:
    """The smallest tensor (values) at which each change is detected with ``POWER``."""

    narrower: int
    wider: int
    shifted: int

    @property
    def needed(self) -> int:
        return max(self.narrower, self.wider, self.shifted)


def smallest(kind: str) -> Powered:
    """For a distribution kind ("uniform", "normal"), the sizes the changes need."""
    return Powered(
        _first(lambda n: scale_power(kind, n, SCALES[0]) >= POWER),
        _first(lambda n: scale_power(kind, n, SCALES[1]) >= POWER),
        _first(lambda n: shift_power(kind, n, SHIFT) >= POWER),
    )


def _first(ok: Callable[[int], bool]) -> int:
    """The smallest n ≥ 2 with ok(n), the powers growing with n."""
    hi = 2
    while not ok(hi):
        hi *= 2
    lo = hi // 2
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi if hi > 2 or not ok(2) else 2


def under_powered(sizes: dict[str, tuple[Dist, int, int]]) -> dict[str, str]:
    """Of tensors ``name -> (distribution, values, values pooled with its module's tensors
    drawn the same way)``, those too small for a change to be detected with ``POWER``, each
    with the changes it misses."""
    out = {}
    needs = {kind: smallest(kind) for kind in ("uniform", "normal")}
    for name, (dist, n, pooled) in sizes.items():
        if not dist.random:
            continue
        need, size = needs[dist.kind], max(n, pooled)
        missed = [
            what
            for what, at in (
                (f"std x{SCALES[0]}", need.narrower),
                (f"std x{SCALES[1]}", need.wider),
                (f"mean +{SHIFT} std", need.shifted),
            )
            if size < at
        ]
        if missed:
            out[name] = f"{size} values: misses {', '.join(missed)}"
    return out

"""The distributions module init draws from, and the statistical tests that hold values to
one: bounds, constancy, one- and two-sample Kolmogorov-Smirnov tests.

Every test here has a false-alarm chance set in advance (see ``Z``, ``KS_ALPHA_C``,
``RANDOM_CHANCE``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch

# Normal draws must lie within mean ± Z·std: a false alarm per value of 2Φ(-6.5) = 8.0e-11.
Z = 6.5
KS_ALPHA_C = 1.949  # c(alpha) of the Kolmogorov-Smirnov tests at alpha = 0.001
# A random tensor must not look constant, nor two ranks' shards equal, where a true random
# draw would do so by chance with at most this probability. Two draws of a continuous
# distribution rounded to a dtype coincide with probability <= eps/2 (uniform: the widest
# rounding interval is eps·|bound| of a range 2·|bound|; normal: eps·max x·φ(x) < eps/2), so
# n values are all equal with probability <= (eps/2)^(n-1), m pairs with <= (eps/2)^m:
# float32 from 2 values (1 pair) on, bfloat16 from 4 values (3 pairs) on.
RANDOM_CHANCE = 1e-7

Kind = Literal["uniform", "normal", "constant"]


@dataclasses.dataclass(frozen=True)
class Dist:
    kind: Kind
    a: float  # lo, mean or the value
    b: float = 0.0  # hi or std

    def __str__(self) -> str:
        if self.kind == "uniform":
            return f"uniform({self.a:.6g}, {self.b:.6g})"
        if self.kind == "normal":
            return f"normal({self.a:.6g}, {self.b:.6g})"
        return f"constant {self.a:g}"

    @property
    def random(self) -> bool:
        return self.kind != "constant"

    def bounds(self, dtype: torch.dtype) -> tuple[float, float]:
        """Where every value must lie, widened by one rounding step of ``dtype``."""
        lo, hi = (self.a, self.b) if self.kind == "uniform" else (self.a - Z * self.b, self.a + Z * self.b)
        slack = max(abs(lo), abs(hi)) * _eps(dtype)
        return lo - slack, hi + slack

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "uniform":
            return ((x - self.a) / (self.b - self.a)).clamp(0, 1)
        return 0.5 * (1 + torch.erf((x - self.a) / (self.b * math.sqrt(2))))


def uniform(lo: float, hi: float) -> Dist:
    return Dist("uniform", lo, hi) if hi > lo else Dist("constant", lo)


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def coincidence(dtype: torch.dtype) -> float:
    """Bound on the chance that two random draws rounded to ``dtype`` are equal."""
    return max(_eps(dtype), torch.finfo(torch.float64).eps) / 2


def may_look_constant(n: int, dtype: torch.dtype) -> bool:
    """Whether n random values could all be equal by chance (more likely than RANDOM_CHANCE)."""
    return n < 2 or coincidence(dtype) ** (n - 1) > RANDOM_CHANCE


def ks_one_sample(values: torch.Tensor, dist: Dist) -> tuple[float, float]:
    """One-sample Kolmogorov-Smirnov statistic against ``dist`` and its critical value."""
    x = values.double().flatten().sort().values
    n = x.numel()
    f = dist.cdf(x)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    d = torch.maximum(i / n - f, f - (i - 1) / n).max().item()
    return d, KS_ALPHA_C / math.sqrt(n)


def ks_two_sample(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov statistic and its critical value."""
    a, b = a.double().flatten(), b.double().flatten()
    n, m = a.numel(), b.numel()
    values = torch.cat([a, b]).sort().values
    cdf_a = torch.searchsorted(a.sort().values, values, right=True) / n
    cdf_b = torch.searchsorted(b.sort().values, values, right=True) / m
    return (cdf_a - cdf_b).abs().max().item(), KS_ALPHA_C * math.sqrt((n + m) / (n * m))


def judge(values: torch.Tensor, dist: Dist) -> tuple[str | None, float | None]:
    """Why ``values`` (finite) were not drawn from ``dist``, or None; and the KS statistic
    over its critical value, where the tensor is large enough for the test to reject."""
    x = values.detach().double().flatten()
    n = x.numel()
    if n == 0:
        return None, None
    if dist.kind == "constant":
        expected = torch.tensor(dist.a, dtype=values.dtype).double().item()
        wrong = x != expected
        if wrong.any():
            return f"{int(wrong.sum())} of {n} values differ from {expected:g} (e.g. {x[wrong][0].item():.6g})", None
        return None, None
    lo, hi = dist.bounds(values.dtype)
    outside = (x < lo) | (x > hi)
    if outside.any():
        where = f"[{lo:.6g}, {hi:.6g}]" if dist.kind == "uniform" else f"mean ± {Z}·std = [{lo:.6g}, {hi:.6g}]"
        return (
            f"{int(outside.sum())} of {n} values outside {where} (min {x.min().item():.6g}, max {x.max().item():.6g})",
            None,
        )
    if not may_look_constant(n, values.dtype) and (x == x[0]).all():
        return f"all {n} values equal {x[0].item():.6g}", None
    d, critical = ks_one_sample(x, dist)
    if critical >= 1:  # too few values for the test to reject anything
        return None, None
    if d > critical:
        return f"KS statistic {d:.3f} > {critical:.3f}", d / critical
    return None, d / critical

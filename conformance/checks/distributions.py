"""The distributions module init draws from, and the statistical tests that hold values to
one: bounds, constancy, the mean, the scale, one- and two-sample Kolmogorov-Smirnov tests.

Every test here has a false-alarm chance set in advance (see ``Z``, ``ALPHA``,
``RANDOM_CHANCE``) and a power that ``power`` computes for the changes the docs tabulate.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch

# Normal draws must lie within mean ± Z·std: a false alarm per value of 2Φ(-6.5) = 8.0e-11.
Z = 6.5
# The false-alarm chance of each of a random tensor's three tests (mean, scale, KS): 3e-5 per
# tensor, so that the few hundred tensors a ci run judges raise a false alarm in under 1% of
# runs; the docs tabulate what each test detects at this alpha.
ALPHA = 1e-5
# c(alpha) of the Kolmogorov-Smirnov tests: the asymptotic sqrt(-ln(alpha / 2) / 2), which
# over-states the exact critical value at small n (conservative)
KS_ALPHA_C = math.sqrt(-math.log(ALPHA / 2) / 2)
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

    def mean_std(self) -> tuple[float, float]:
        if self.kind == "uniform":
            return (self.a + self.b) / 2, (self.b - self.a) / math.sqrt(12)
        return (self.a, self.b) if self.kind == "normal" else (self.a, 0.0)

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


def _z(p: float) -> float:
    """The standard normal deviate beyond which a tail holds probability ``p``."""
    return max(0.0, -torch.special.ndtri(torch.tensor(min(max(p, 1e-300), 0.5), dtype=torch.float64)).item())


# the critical |z| of the mean's test: the normal's mean is exactly normal; a uniform's is
# sub-Gaussian with its variance (sinh(t)/t <= exp(t^2/6)), so P(|z| > t) <= 2 exp(-t^2 / 2)
MEAN_Z = {"normal": _z(ALPHA / 2), "uniform": math.sqrt(2 * math.log(2 / ALPHA))}


def mean_test(x: torch.Tensor, dist: Dist) -> tuple[str | None, float]:
    """A z-test of the mean of ``x`` (float64) against ``dist``'s, at ``ALPHA``: the failure (or
    None) and |z| over its critical value."""
    n = x.numel()
    mean, std = dist.mean_std()
    z = (x.mean().item() - mean) / (std / math.sqrt(n))
    critical = MEAN_Z[dist.kind]
    if abs(z) > critical:
        return (
            f"mean {x.mean().item():.4g} is {z:+.2f} standard errors from {mean:.4g} (at most {critical:.2f}): "
            f"shifted by {(x.mean().item() - mean) / std:+.3f} std",
            abs(z) / critical,
        )
    return None, abs(z) / critical


def scale_test(x: torch.Tensor, dist: Dist, dtype: torch.dtype) -> tuple[str | None, float]:
    """A test of the spread of ``x`` (float64) at ``ALPHA``: the failure (or None) and its
    statistic over the critical value in z units. Normal: sum((x - mean) / std)^2 is
    chi-square with n degrees of freedom (exact, two-sided; wider or narrower). Uniform: a
    narrower draw keeps every value within r of the centre (r the half-width's fraction), which
    a true draw does with probability r^n (exact; one-sided: a wider one is the bounds' job);
    r is widened by one rounding step of ``dtype`` so that rounding cannot fail a true draw."""
    n = x.numel()
    if dist.kind == "normal":
        chi2 = (((x - dist.a) / dist.b) ** 2).sum()
        half = torch.tensor(n / 2, dtype=torch.float64)
        tail = min(torch.special.gammainc(half, chi2 / 2).item(), torch.special.gammaincc(half, chi2 / 2).item())
        ratio = _z(tail) / _z(ALPHA / 2)
        if tail < ALPHA / 2:
            std = math.sqrt(chi2.item() / n) * dist.b
            return (
                f"std {std:.4g} ({std / dist.b:.3f} x {dist.b:.4g}): a chi-square test on {n} values rejects it "
                f"(tail {tail:.2g} < {ALPHA / 2:g})",
                ratio,
            )
        return None, ratio
    centre, half_width = (dist.a + dist.b) / 2, (dist.b - dist.a) / 2
    rounding = _eps(dtype) * max(abs(dist.a), abs(dist.b)) / half_width
    r = min(1.0, (x - centre).abs().max().item() / half_width + rounding)
    chance = r**n
    ratio = _z(chance) / _z(ALPHA)
    if chance < ALPHA:
        return (
            f"all {n} values within ±{r:.3f} x the half-width {half_width:.4g}: a narrower draw (a true one "
            f"does so with probability {chance:.2g} < {ALPHA:g})",
            ratio,
        )
    return None, ratio


def judge(values: torch.Tensor, dist: Dist) -> tuple[str | None, float | None]:
    """Why ``values`` (finite) were not drawn from ``dist``, or None; and the largest of the
    tests' statistics over their critical values (a z-equivalent; > 1 fails)."""
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
    ratios = []
    for found, ratio in (mean_test(x, dist), scale_test(x, dist, values.dtype)):
        ratios.append(ratio)
        if found is not None:
            return found, ratio
    d, critical = ks_one_sample(x, dist)
    if critical < 1:  # too few values for the KS test to reject anything otherwise
        ratios.append(d / critical)
        if d > critical:
            return f"KS statistic {d:.3f} > {critical:.3f}", d / critical
    return None, max(ratios)

"""What module init must draw, derived from the eager model: for every parameter, the
distribution its module's ``reset_parameters`` draws from, and the tests that hold values
to it.

A small registry, keyed by the class whose ``reset_parameters`` runs, knows torch's built-in
layers and litgpt's RMSNorm: uniform(lo, hi), normal(mean, std) or a constant. Each entry is
first checked against a fresh eager draw of the same model; where no entry applies, or the
eager draw does not fit it, the expectation is found empirically: two fresh draws with
different seeds, identical → deterministic (Thunder's values must equal eager's), different →
random, held only to a two-sample KS test against a fresh draw. A tied weight's expected
distribution is the one of the owner whose draw the fresh eager model kept.

Every test here has a false-alarm chance set in advance (see ``Z``, ``KS_ALPHA_C``,
``RANDOM_CHANCE``); none of them reads what Thunder produced to decide what to expect.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from fixtures import patterns

# Normal draws must lie within mean ± Z·std: a false alarm per value of 2Φ(-6.5) = 8.0e-11,
# 7.1e-8 for the 888 normal values of the largest model (litgpt's wte), < 1e-6 per ci run.
Z = 6.5
KS_ALPHA_C = 1.949  # c(alpha) of the Kolmogorov-Smirnov tests at alpha = 0.001
# A random tensor must not look constant, nor two ranks' shards equal, where a true random
# draw would do so by chance with at most this probability. Two draws of a continuous
# distribution rounded to a dtype coincide with probability <= eps/2 (uniform: the widest
# rounding interval is eps·|bound| of a range 2·|bound|; normal: eps·max x·φ(x) < eps/2), so
# n values are all equal with probability <= (eps/2)^(n-1), m pairs with <= (eps/2)^m:
# float32 from 2 values (1 pair) on, bfloat16 from 4 values (3 pairs) on.
RANDOM_CHANCE = 1e-7
FRESH_SEEDS = (7919, 7927)

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


# ---------------------------------------------------------------------------------------
# The registry: class whose reset_parameters runs -> (module, parameter name) -> Dist | None


def _linear(m: nn.Module, name: str) -> Dist | None:
    # kaiming_uniform_(a=√5): gain √(2/(1+5)), bound gain·√(3/fan_in) = 1/√fan_in; the bias
    # is drawn from the same bound (0 where fan_in is 0)
    fan_in = math.prod(m.weight.shape[1:])
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return uniform(-bound, bound) if name in ("weight", "bias") else None


def _embedding(m: nn.Module, name: str) -> Dist | None:
    # normal_(0, 1), then the padding row zeroed: not one distribution, left to the fallback
    return Dist("normal", 0.0, 1.0) if name == "weight" and m.padding_idx is None else None


def _ones_zeros(m: nn.Module, name: str) -> Dist | None:
    return {"weight": Dist("constant", 1.0), "bias": Dist("constant", 0.0)}.get(name)


REGISTRY: dict[str, Callable[[nn.Module, str], Dist | None]] = {
    "torch.nn.modules.linear.Linear": _linear,
    "torch.nn.modules.sparse.Embedding": _embedding,
    "torch.nn.modules.normalization.LayerNorm": _ones_zeros,
    "torch.nn.modules.normalization.RMSNorm": _ones_zeros,
    "torch.nn.modules.normalization.GroupNorm": _ones_zeros,
    "torch.nn.modules.batchnorm._NormBase": _ones_zeros,
    "litgpt.model.RMSNorm": _ones_zeros,
}


def registered(module: nn.Module, name: str) -> Dist | None:
    """What ``module.reset_parameters`` draws for its parameter ``name``, where the registry
    knows the class that defines the ``reset_parameters`` the module runs."""
    for cls in type(module).__mro__:
        if "reset_parameters" in vars(cls):
            rule = REGISTRY.get(f"{cls.__module__}.{cls.__qualname__}")
            return rule(module, name) if rule else None
    return None


# ---------------------------------------------------------------------------------------
# Expectations from the eager model


@dataclasses.dataclass
class Expectation:
    """What Thunder's module init must produce for one parameter (one name per tied group)."""

    name: str
    shape: tuple[int, ...]
    # (class, distribution) of the owners whose draw the fresh eager model kept
    fits: list[tuple[str, Dist]]
    # (class, distribution) of the tie's other owners, whose draw eager discards
    others: list[tuple[str, Dist]]
    # empirical fallback: "deterministic" or "random" (then only the KS test), None if fits
    empirical: Literal["deterministic", "random"] | None = None
    owner: str = ""  # what drew the fallback's reference: "Cls.reset_parameters" or "Cls's construction"
    fresh: torch.Tensor | None = None  # a fresh eager draw (the fallback's reference)
    fresh_constant: bool = False  # whether the fresh draws were constant themselves

    @property
    def random(self) -> bool:
        if self.empirical is not None:
            return self.empirical == "random"
        return any(d.random for _, d in self.fits)

    def describe(self) -> str:
        if self.empirical == "deterministic":
            return f"as eager ({self.owner} draws nothing at random)"
        if self.empirical == "random":
            return f"like a fresh draw of {self.owner} (KS test only)"
        return " or ".join(f"{d} ({cls}.reset_parameters)" for cls, d in self.fits)


def expectations(build: Callable[[], nn.Module]) -> dict[str, Expectation]:
    """For every parameter of the model ``build`` makes (on the CPU, in float32), what module
    init must draw. ``build`` is called with fresh seeds; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FRESH_SEEDS[0])
        fresh = build()
        torch.manual_seed(FRESH_SEEDS[1])
        again = build()
    modules = dict(fresh.named_modules())
    owners: dict[int, list[tuple[str, str]]] = {}  # storage -> (owner module name, leaf)
    first: dict[int, str] = {}
    for full, p in fresh.named_parameters(remove_duplicate=False):
        owner, _, leaf = full.rpartition(".")
        owners.setdefault(id(p), []).append((owner, leaf))
        first.setdefault(id(p), full)
    out = {}
    for key, name in first.items():
        value = fresh.get_parameter(name).detach()
        candidates = []
        for owner, leaf in owners[key]:
            dist = registered(modules[owner], leaf)
            if dist is not None and (type(modules[owner]).__name__, dist) not in candidates:
                candidates.append((type(modules[owner]).__name__, dist))
        fits = [(cls, d) for cls, d in candidates if judge(value, d)[0] is None]
        exp = Expectation(name, tuple(value.shape), fits, [c for c in candidates if c not in fits])
        if not fits:
            exp.others = []
            exp.owner, draws = _fallback_draws(modules, owners[key], value, again.get_parameter(name).detach())
            exp.fresh = draws[0]
            exp.empirical = "deterministic" if torch.equal(*draws) else "random"
            exp.fresh_constant = bool(draws[0].numel() and (draws[0] == draws[0].flatten()[0]).all())
        out[name] = exp
    return out


def buffer_expectations(build: Callable[[], nn.Module]) -> dict[str, Expectation]:
    """For every buffer the model ``build`` makes that eager draws at random (two fresh builds
    with different seeds differ), what module init must draw: held, like a parameter no
    registry entry knows, to a fresh draw (not constant; a two-sample KS test). A buffer
    eager computes (rotary caches) is deterministic: Thunder's must equal eager's, which is
    not an expectation here."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FRESH_SEEDS[0])
        fresh = build()
        torch.manual_seed(FRESH_SEEDS[1])
        again = dict(build().named_buffers())
    out = {}
    for name, value in fresh.named_buffers():
        other = again.get(name)
        if not value.is_floating_point() or other is None or torch.equal(value, other):
            continue
        owner = fresh.get_submodule(name.rpartition(".")[0])
        out[name] = Expectation(
            name,
            tuple(value.shape),
            fits=[],
            others=[],
            empirical="random",
            owner=f"{type(owner).__name__}'s construction",
            fresh=value.detach().clone(),
            fresh_constant=bool(value.numel() and (value == value.flatten()[0]).all()),
        )
    return out


def _fallback_draws(
    modules: dict[str, nn.Module], owners: list[tuple[str, str]], built: torch.Tensor, rebuilt: torch.Tensor
) -> tuple[str, tuple[torch.Tensor, torch.Tensor]]:
    """What drew them, and two fresh draws with different seeds: the single owner's own
    reset_parameters on fresh copies, or (a tied weight, an owner without reset_parameters)
    two fresh builds of the model."""
    (owner, leaf), *rest = owners
    module = modules[owner]
    if rest or not hasattr(module, "reset_parameters"):
        return f"{type(module).__name__}'s construction", (built.clone(), rebuilt.clone())
    draws = []
    with torch.random.fork_rng(devices=[]):
        for seed in FRESH_SEEDS:
            twin = copy.deepcopy(module)
            torch.manual_seed(seed)
            twin.reset_parameters()
            draws.append(getattr(twin, leaf).detach().clone())
    return f"{type(module).__name__}.reset_parameters", (draws[0], draws[1])


# ---------------------------------------------------------------------------------------
# Tests of values


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


def check_values(value: torch.Tensor | None, exp: Expectation, dtype: torch.dtype) -> tuple[str | None, float | None]:
    """Why Thunder's initial ``value`` breaks ``exp`` (one message), or None; and the KS ratio."""
    if value is None:
        return "missing", None
    if not isinstance(value, torch.Tensor):
        return f"not a tensor: {type(value).__name__}", None
    problems = []
    if tuple(value.shape) != exp.shape:
        return f"shape {tuple(value.shape)}, expected {exp.shape}", None
    if value.dtype != dtype:
        problems.append(f"dtype {value.dtype}, expected {dtype}")
    if value.dtype.is_floating_point or value.dtype.is_complex:
        finite = torch.isfinite(value)
        if not finite.all():
            nan = int(torch.isnan(value).sum())
            problems.append(f"{int((~finite).sum())} of {value.numel()} values not finite ({nan} NaN)")
            return "; ".join(problems), None
    found, ratio = _against(value, exp)
    return "; ".join([*problems, *([found] if found else [])]) or None, ratio


def _against(value: torch.Tensor, exp: Expectation) -> tuple[str | None, float | None]:
    if exp.empirical == "deterministic":
        fresh = exp.fresh.to(value.dtype)
        if not torch.equal(value, fresh):
            err = (value.double() - fresh.double()).abs().max().item()
            return (
                f"differs from eager, where {exp.owner} draws nothing at random: max abs err {err:.3g}",
                None,
            )
        return None, None
    if exp.empirical == "random":
        x = value.double().flatten()
        if not exp.fresh_constant and not may_look_constant(x.numel(), value.dtype) and (x == x[0]).all():
            return f"all {x.numel()} values equal {x[0].item():.6g}", None
        d, critical = ks_two_sample(x, exp.fresh)
        if critical >= 1:
            return None, None
        if d > critical:
            return (
                f"not distributed like a fresh draw of {exp.owner}: KS statistic {d:.3f} > {critical:.3f}",
                d / critical,
            )
        return None, d / critical
    verdicts = [judge(value, d) for _, d in exp.fits]
    ratios = [r for _, r in verdicts if r is not None]
    if any(found is None for found, _ in verdicts):
        return None, min(ratios, default=None)
    expected_cls, expected = exp.fits[0]
    for cls, dist in exp.others:
        if judge(value, dist)[0] is None:
            return f"drawn like {cls}.reset_parameters, not like {expected_cls}.reset_parameters", None
    return f"{verdicts[0][0]}: {expected_cls}.reset_parameters draws {expected}", verdicts[0][1]


def shard_copies(value: torch.Tensor, world: int) -> tuple[str | None, int, int]:
    """Whether ranks' dim-0 shards of ``value`` (chunks of ceil(dim0 / world) rows, as FSDP
    pads; the last may be partial or empty) equal one another over the rows both hold.
    Returns the failure (or None), the pairs compared, and the pairs too small to compare."""
    if value.dim() == 0 or world < 2:
        return None, 0, 0
    rows = value.shape[0]
    chunk = patterns.chunk_rows(rows, world)
    shards = [value[r * chunk : min((r + 1) * chunk, rows)] for r in range(world)]
    equal, compared, skipped = [], 0, 0
    for r in range(world):
        for s in range(r + 1, world):
            common = min(len(shards[r]), len(shards[s]))
            if common == 0:
                continue
            a, b = shards[r][:common], shards[s][:common]
            if coincidence(value.dtype) ** a.numel() > RANDOM_CHANCE:
                skipped += 1
                continue
            compared += 1
            if torch.equal(a, b):
                equal.append(f"{r} and {s} ({common} rows)")
    if equal:
        return f"shards of ranks {', '.join(equal)} are equal: copies, not parts of one draw", compared, skipped
    return None, compared, skipped

"""What module init must draw, derived from the eager model: for every parameter, the
distribution its module's ``reset_parameters`` draws from (``distributions``, whose tests
hold values to it).

A small registry, keyed by the class whose ``reset_parameters`` runs, knows torch's built-in
layers and litgpt's RMSNorm: uniform(lo, hi), normal(mean, std) or a constant. Each entry is
first checked against a fresh eager draw of the same model; where no entry applies, or the
eager draw does not fit it, the expectation is found empirically: two fresh draws with
different seeds, identical → deterministic (Thunder's values must equal eager's), different →
random, held only to a two-sample KS test against a fresh draw. A tied weight's expected
distribution is the one of the owner whose draw the fresh eager model kept.

No expectation reads what Thunder produced.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from conformance.checks.distributions import Dist, judge, uniform

FRESH_SEEDS = (7919, 7927)

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

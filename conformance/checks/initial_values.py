"""Thunder's initial values held to what module init must draw (``draws.Expectation``): the
values of one tensor, and whether ranks' shards of a random tensor are copies of one another."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from conformance.checks.distributions import (
    RANDOM_CHANCE,
    Dist,
    coincidence,
    judge,
    ks_two_sample,
    may_look_constant,
)
from conformance.checks.draws import Expectation
from fixtures import patterns


@dataclasses.dataclass(frozen=True)
class Problem:
    """Why an initial value breaks what module init must draw: a message, and fields a failure
    carries (``problems``: the kinds found, in order; beside them what names the kind:
    ``drawn_like``/``expected_like`` the module classes whose draws it matches and should)."""

    message: str
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)


def _problem(parts: list[tuple[str, str]], **fields: Any) -> Problem | None:
    """One Problem of (kind, message) parts, or None where there are none."""
    if not parts:
        return None
    return Problem("; ".join(m for _, m in parts), {"problems": [k for k, _ in parts], **fields})


def check_values(
    value: torch.Tensor | None, exp: Expectation, dtype: torch.dtype
) -> tuple[Problem | None, float | None]:
    """Why Thunder's initial ``value`` breaks ``exp``, or None; and the KS ratio."""
    if value is None:
        return _problem([("missing", "missing")]), None
    if not isinstance(value, torch.Tensor):
        return _problem([("not_a_tensor", f"not a tensor: {type(value).__name__}")]), None
    problems = []
    if tuple(value.shape) != exp.shape:
        return _problem([("shape", f"shape {tuple(value.shape)}, expected {exp.shape}")]), None
    if value.dtype != dtype:
        problems.append(("dtype", f"dtype {value.dtype}, expected {dtype}"))
    if value.dtype.is_floating_point or value.dtype.is_complex:
        finite = torch.isfinite(value)
        if not finite.all():
            nan = int(torch.isnan(value).sum())
            problems.append(("not_finite", f"{int((~finite).sum())} of {value.numel()} values not finite ({nan} NaN)"))
            return _problem(problems), None
    found, ratio = _against(value, exp)
    if found is None:
        return _problem(problems), ratio
    kind, message, fields = found
    return _problem([*problems, (kind, message)], **fields), ratio


def _against(value: torch.Tensor, exp: Expectation) -> tuple[tuple[str, str, dict[str, str]] | None, float | None]:
    """(kind, message, fields) of what is wrong with a value of the right shape, or None; and
    the KS ratio."""
    if exp.empirical == "deterministic":
        fresh = exp.fresh.to(value.dtype)
        if not torch.equal(value, fresh):
            err = (value.double() - fresh.double()).abs().max().item()
            message = f"differs from eager, where {exp.owner} draws nothing at random: max abs err {err:.3g}"
            return ("differs_from_eager", message, {}), None
        return None, None
    if exp.empirical == "random":
        x = value.double().flatten()
        if not exp.fresh_constant and not may_look_constant(x.numel(), value.dtype) and (x == x[0]).all():
            return ("constant", f"all {x.numel()} values equal {x[0].item():.6g}", {}), None
        d, critical = ks_two_sample(x, exp.fresh)
        if critical >= 1:
            return None, None
        if d > critical:
            message = f"not distributed like a fresh draw of {exp.owner}: KS statistic {d:.3f} > {critical:.3f}"
            return ("not_like_fresh", message, {}), d / critical
        return None, d / critical
    verdicts = [judge(value, d) for _, d in exp.fits]
    ratios = [r for _, r in verdicts if r is not None]
    if any(found is None for found, _ in verdicts):
        return None, min(ratios, default=None)
    expected_cls, expected = exp.fits[0]
    for cls, dist in exp.others:
        if judge(value, dist)[0] is None:
            message = f"drawn like {cls}.reset_parameters, not like {expected_cls}.reset_parameters"
            return ("drawn_like", message, {"drawn_like": cls, "expected_like": expected_cls}), None
    message = f"{verdicts[0][0]}: {expected_cls}.reset_parameters draws {expected}"
    return ("not_drawn_like", message, {"expected_like": expected_cls}), verdicts[0][1]


def pools(expected: dict[str, Expectation]) -> dict[str, tuple[Dist, list[str]]]:
    """A module's random parameters its ``reset_parameters`` draws from one distribution (a
    Linear's weight and bias), keyed by the module: judged together as well, so that a module
    drawn wrong as a whole is found even where each of its tensors alone is too small (only
    modules with two or more such tensors)."""
    groups: dict[tuple[str, Dist], list[str]] = {}
    for name, exp in expected.items():
        if exp.empirical is None and len(exp.fits) == 1 and exp.fits[0][1].random:
            groups.setdefault((name.rpartition(".")[0], exp.fits[0][1]), []).append(name)
    return {f"{module or '(root)'}": (dist, names) for (module, dist), names in groups.items() if len(names) > 1}


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

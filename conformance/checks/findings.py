"""What a check found on one rank (failures with messages, and the numbers it measured), and
what a rank answers for a whole cell: the findings of every area that applies, or why the
cell could not be built."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch


class ThunderReturnedWrong(Exception):
    """Raised on a rank where what Thunder returned cannot be read on, so the cell cannot
    continue (an output of the wrong shape, which no loss can weigh): the front end reports
    the cell as not conforming with this message, never as the kit's error."""


def returned_wrong(error: str | None) -> str | None:
    """The message of a ``ThunderReturnedWrong`` in a rank's formatted traceback, or None."""
    last = (error or "").strip().splitlines()[-1:] or [""]
    marker = f"{ThunderReturnedWrong.__module__}.{ThunderReturnedWrong.__qualname__}: "
    return last[0][len(marker) :] if last[0].startswith(marker) else None


def raised_kind(error: str) -> str:
    """The kind of a raise named ``Kind at file:line in function: message`` (or ``Kind:
    message``, where it had no frame): what an xfails entry pins."""
    return error.split(" ", 1)[0].rstrip(":")


@dataclasses.dataclass
class Crash:
    """A check that raised instead of judging: the kit's failure, never Thunder's verdict."""

    error: str  # the traceback
    frames: list[dict[str, Any]]  # outermost first: {"file", "line", "function"}

    @classmethod
    def of(cls, exc: BaseException) -> Crash:
        frames = [
            {"file": f.filename, "line": f.lineno, "function": f.name} for f in traceback.extract_tb(exc.__traceback__)
        ]
        return cls("".join(traceback.format_exception(exc)), frames)


# what an xfails table names beside a failure's fields (frontend/templates.py): never a field
RESERVED = frozenset({"code", "when"})


@dataclasses.dataclass
class Failure:
    """One failure a check found on one rank. ``code`` (``collectives.count``) and ``fields``
    (``{phase, kind, got, alternative}``) say what failed, stably: xfails entries match them
    (conformance/frontend/xfails.py). ``derived`` holds the numbers the kit derived for it
    from the model, eager PyTorch and the world size (checks/derived.py names them), which an
    entry's field may be held to (``got = "{unbucketed}"``). ``message`` is for people and may
    be reworded freely: nothing matches it."""

    code: str
    message: str
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    derived: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Findings:
    found: list[Failure] = dataclasses.field(default_factory=list)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    crash: Crash | None = None  # the check itself raised: nothing above is a verdict

    @property
    def failures(self) -> list[str]:
        """The failures' messages, in the order found (what people read)."""
        return [f.message for f in self.found]

    def fail(self, code: str, message: str, derived: Mapping[str, float] | None = None, **fields: Any) -> None:
        """Record a failure: its code and fields, what the kit derived for it, its message."""
        if reserved := sorted(set(fields) & RESERVED):
            # an xfails table could never name such a field (frontend/templates.py), so never match it
            raise ValueError(f"{code}: a failure's field may not be named {', '.join(reserved)}")
        kept = {k: _plain(v) for k, v in fields.items() if v is not None}
        self.found.append(Failure(code, message, kept, dict(derived or {})))

    @contextlib.contextmanager
    def expect(
        self,
        code: str,
        what: str,
        derived: Mapping[str, float] | None = None,
        fields: Mapping[str, Any] | None = None,
        **more: Any,
    ) -> Iterator[None]:
        """Record an AssertionError raised inside as a failure ``code`` of ``what`` (with
        ``derived``, the numbers the check derived for it, and its fields: ``fields`` and
        ``more``) and go on. ``derived`` and ``fields`` are read when the assertion fails, so a
        check may fill them as it goes."""
        try:
            yield
        except AssertionError as exc:
            self.fail(code, f"{what}: {exc}", derived, **{**(fields or {}), **more})

    def equal(
        self,
        code: str,
        what: str,
        actual: Any,
        expected: Any,
        derived: Mapping[str, float] | None = None,
        **fields: Any,
    ) -> None:
        """``actual == expected``, recorded as a metric; a failure's fields carry ``got``
        (what Thunder did) and, where it is a number, ``expected`` is among what was derived."""
        self.metrics[what] = {"expected": expected, "actual": actual}
        numeric = isinstance(expected, int | float) and not isinstance(expected, bool)
        known = {"expected": expected, **(derived or {})} if numeric else dict(derived or {})
        if not numeric:
            fields = {"expected": expected, **fields}
        with self.expect(code, what, known, got=actual, **fields):
            assert actual == expected, f"expected {expected}, got {actual}"

    def close(
        self,
        code: str,
        what: str,
        actual: Mapping[str, torch.Tensor],
        expected: Mapping[str, torch.Tensor],
        per_name: Mapping[str, Mapping[str, float]] | None = None,
        fields: Mapping[str, Any] | None = None,
        **tol: float,
    ) -> bool:
        """assert_close per name (with ``per_name`` tolerances where given); the worst absolute
        error over all names becomes a metric. Whether every name was close. Each failure is
        ``code`` with ``fields`` and the tensor's ``name`` and ``problem``: ``missing``, ``not
        gathered``, ``shape``, ``dtype``, ``device``, ``values`` or ``extra`` (a name eager has
        no value for)."""
        failures = len(self.found)
        worst = 0.0
        fields = dict(fields or {})
        # what some rank held that the kit could not gather as it was (conformance/rank/gather.py)
        defects: Mapping[str, str] = getattr(actual, "defects", {})
        for name, exp in expected.items():
            act = actual.get(name)
            problem = _problem(act, exp, name in defects)
            with self.expect(code, f"{what} [{name}]", **fields, name=name, problem=problem):
                assert act is not None, "missing"
                assert name not in defects, f"not gathered as Thunder held it: {defects.get(name)}"
                torch.testing.assert_close(act, exp, **_finite({**tol, **(per_name or {}).get(name, {})}))
            if act is not None and act.shape == exp.shape:
                worst = max(worst, _worst_error(act, exp))
        # a name eager has no value for (a frozen parameter's gradient) must have none here
        for name in actual:
            if name not in expected:
                self.fail(code, f"{what} [{name}]: present where eager has none", **fields, name=name, problem="extra")
        self.metrics[f"{what} max_abs_err"] = worst
        return len(self.found) == failures

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def identical(a: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Whether ``b`` is ``a``: the same shape, dtype and values, bit for bit (False where the
    two cannot be compared: one on ``meta``, say)."""
    try:
        return b is not None and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    except Exception:  # what Thunder handed over may be anything: not the same, then
        return False


def _problem(actual: Any, expected: torch.Tensor, defect: bool) -> str:
    """What is wrong with ``actual`` against ``expected``, should assert_close refuse it: the
    first of missing, not gathered, shape, dtype, device, else its values."""
    if actual is None:
        return "missing"
    if defect:
        return "not gathered"
    for attribute in ("shape", "dtype", "device"):
        if getattr(actual, attribute, None) != getattr(expected, attribute):
            return attribute
    return "values"


def _plain(value: Any) -> Any:
    """A field's value as JSON and TOML hold it: tuples and sets as sorted or ordered lists,
    torch dtypes and other objects as their text."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    return str(value)


def _worst_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest absolute difference; infinite where there is none to take (NaN, values on
    another device, ``meta``: assert_close has named what is wrong)."""
    if not expected.numel():
        return 0.0
    try:
        err = (actual.double() - expected.double()).abs().max().item()
    except (RuntimeError, TypeError):
        return float("inf")
    return err if err == err else float("inf")


def strict_unless_finite(allowance: float) -> float:
    """An allowance, or 0 where it is not finite: one derived from Thunder's own values (the
    float32 twin run at Thunder's weights) is NaN or inf once those are, and may neither
    crash a comparison (assert_close refuses a NaN tolerance) nor let anything pass."""
    return allowance if math.isfinite(allowance) else 0.0


def _finite(tolerances: dict[str, float]) -> dict[str, float]:
    return {k: strict_unless_finite(v) for k, v in tolerances.items()}


@dataclasses.dataclass
class CellResult:
    """One rank's answer for a cell, sent to the controller as JSON."""

    areas: dict[str, Findings] = dataclasses.field(default_factory=dict)  # area name -> its findings
    timings: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds: setup, each step
    unsupported: str | None = None  # why the Thunder under test cannot build the cell at all

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CellResult:
        areas = {}
        for name, found in raw["areas"].items():  # ``raw`` is read again for every area's item
            crash = found.get("crash")
            failures = [Failure(**f) for f in found.get("found", [])]
            areas[name] = Findings(failures, found.get("metrics", {}), Crash(**crash) if crash else None)
        return cls(areas=areas, timings=raw["timings"], unsupported=raw["unsupported"])


def judged(check: Callable[..., Findings], *args: Any) -> Findings:
    """One area's findings; a check that raises is the kit's failure, recorded for that area
    alone so that it hides none of the others."""
    try:
        return check(*args)
    except Exception as exc:
        return Findings(crash=Crash.of(exc))

"""The templates of xfails entries (conformance/frontend/xfails.py): one whole failure
message each, literal text with placeholders, none of them free:

- ``{key}`` (or ``{key+1}``, ``{key-2}``): the number the kit derived under ``key`` for that
  failure (conformance/checks/derived.py names them: ``expected``, ``unbucketed``, ...);
- ``{lo..hi}``: a number within the bounds, inclusive, each a literal (``0``, ``0.05``,
  ``inf``) or a derived ``key`` (``{1..expected}``): for what is measured, not derived;
- ``{name: a.weight, b.bias}``: one of the tensors listed.

A pinned number is written as itself (``got 0``); ``{}`` and ``{name}`` are refused. A
failure given as a table ``{template = "...", when = {axis = [values]}}`` shows only in the
cells its ``when`` names, within its entry's."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

from conformance.checks.derived import DERIVED
from conformance.matrix.cells import AXES, Cell

# the number a numeric placeholder captures: an int or decimal, optionally signed, with an
# exponent, or a float that is not finite (a check prints nan and inf as they are)
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
# one parameter, buffer or output name (dotted, as checks print it)
NAME = r"[\w.]+"
# what ``when`` may name beside the axes: the process group backend of the session (a failure
# that only one backend's devices show: a CUDA-only code path on a gloo world of CPUs)
BACKEND = "backend"
# beside the axes: whether the cell is a simulated world (which checks setup only)
SIMULATED = "simulated"
WHEN_KEYS = (BACKEND, SIMULATED)


def template_pattern(template: str) -> re.Pattern[str]:
    """The regex a failure message must match in full (its numeric placeholders as groups);
    raises ValueError for a template ``parse`` refuses."""
    return parse(template)[0]


def parse(template: str) -> tuple[re.Pattern[str], tuple[Placeholder | None, ...]]:
    """``template``'s regex (each placeholder one group) and, per group, the constraint its
    number must meet (None for a ``{name: ...}`` list, which the regex alone decides)."""
    if not template.strip():
        raise ValueError("a template is empty")
    pattern: list[str] = []
    constraints: list[Placeholder | None] = []
    for i, part in enumerate(re.split(r"(\{[^{}]*\})", template)):
        if i % 2 == 0:
            if "{" in part or "}" in part:
                raise ValueError(f"template {template!r}: a brace outside a placeholder")
            pattern.append(re.escape(part))
            continue
        body = part[1:-1].strip()
        if not body:
            raise ValueError(
                f"template {template!r}: a free {{}} excuses any number: name what the kit derived "
                "({expected}) or give a range ({0..0.05})"
            )
        if body == "name":
            raise ValueError(f"template {template!r}: {{name}} excuses any tensor: list them ({{name: a.weight, b}})")
        if body.startswith("name:"):
            names = [n.strip() for n in body.removeprefix("name:").split(",")]
            if not all(re.fullmatch(NAME, n) for n in names):
                raise ValueError(f"template {template!r}: {part} must list tensor names separated by commas")
            pattern.append("(" + "|".join(map(re.escape, names)) + ")")
            constraints.append(None)
            continue
        pattern.append(f"({NUMBER})")
        constraints.append(Placeholder.parse(body, template))
    return re.compile("".join(pattern)), tuple(constraints)


@dataclasses.dataclass(frozen=True)
class Bound:
    """A number written in a template: a literal, or what the kit derived under ``key`` plus
    ``offset``."""

    key: str | None
    offset: float = 0.0

    @classmethod
    def parse(cls, text: str, template: str) -> Bound:
        text = text.strip()
        if re.fullmatch(NUMBER, text):
            return cls(None, float(text))
        m = re.fullmatch(r"([a-z_][a-z0-9_]*)\s*(?:([+-])\s*(\d+(?:\.\d*)?))?", text)
        if m is None:
            raise ValueError(f"template {template!r}: {text!r} is neither a number nor a derived name (+/- a number)")
        if m[1] not in DERIVED:
            raise ValueError(f"template {template!r}: {m[1]!r} is not a derived value (known: {', '.join(DERIVED)})")
        offset = float(m[3]) * (-1 if m[2] == "-" else 1) if m[3] else 0.0
        return cls(m[1], offset)

    def value(self, derived: Mapping[str, float]) -> float | None:
        if self.key is None:
            return self.offset
        base = derived.get(self.key)
        return None if base is None else float(base) + self.offset


@dataclasses.dataclass(frozen=True)
class Placeholder:
    """A number of the message: ``{key}`` (or ``{key+1}``) equals what the kit derived for that
    failure; ``{lo..hi}`` lies within the bounds, inclusive (literals or derived)."""

    low: Bound
    high: Bound

    @classmethod
    def parse(cls, body: str, template: str) -> Placeholder:
        if ".." in body:
            low, high = (Bound.parse(b, template) for b in body.split("..", 1))
            if low.key is None and high.key is None and low.offset > high.offset:
                raise ValueError(f"template {template!r}: {{{body}}} is an empty range")
            return cls(low, high)
        bound = Bound.parse(body, template)
        if bound.key is None:
            raise ValueError(f"template {template!r}: a pinned number is written as itself, not as {{{body}}}")
        return cls(bound, bound)

    def holds(self, number: str, derived: Mapping[str, float]) -> bool:
        x, low, high = float(number), self.low.value(derived), self.high.value(derived)
        if low is None or high is None:  # the failure carries no such derived value
            return False
        if self.low == self.high and math.isnan(x) and math.isnan(low):  # the kit derived nan, as printed
            return True
        return low <= x <= high


@dataclasses.dataclass(frozen=True)
class Template:
    """One failure an entry expects: its text, the cells it shows in beside the entry's
    (``when``, {} = all of them) and where it is written (FILE:LINE)."""

    text: str
    when: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    source: str = "<xfails>"
    pattern: re.Pattern[str] = dataclasses.field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    placeholders: tuple[Placeholder | None, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.pattern is None:
            pattern, placeholders = parse(self.text)
            object.__setattr__(self, "pattern", pattern)
            object.__setattr__(self, "placeholders", placeholders)

    def names(self, cell: Cell, backend: str | None = None) -> bool:
        return when_names(self.when, cell, backend)

    def matches(self, failure: str, derived: Mapping[str, float] | None = None) -> bool:
        """Whether the first line of ``failure`` is this template in full, each number the
        one the kit derived for it (``derived``) or within its range."""
        # the first line: assert_close's detail lines below it (mismatch counts, the greatest
        # difference) describe the tensors, not what failed
        m = self.pattern.fullmatch(failure.split("\n", 1)[0])
        if m is None:
            return False
        numbers = zip(m.groups(), self.placeholders, strict=True)
        return all(p is None or p.holds(x, derived or {}) for x, p in numbers)


def when_names(when: Mapping[str, list[str]], cell: Cell, backend: str | None) -> bool:
    on = {BACKEND: backend}
    value = lambda axis: on[axis] if axis in on else getattr(cell, axis)  # noqa: E731
    return all(str(value(axis)) in map(str, values) for axis, values in when.items())


TEMPLATE_FIELDS = ("template", "when")  # a failure given as a table: its template and the cells it shows in


def template_of(raw: object, where: str) -> Template:
    """One entry of an xfails entry's ``failures``: a template string or a {template, when}
    table; ValueError saying what is wrong with it."""
    if isinstance(raw, str):
        return Template(raw, source=where)
    if not isinstance(raw, dict):
        raise ValueError("each failure is a template string or a {template, when} table")
    unknown = sorted(set(raw) - set(TEMPLATE_FIELDS))
    if unknown or not isinstance(raw.get("template"), str):
        raise ValueError(f"a failure given as a table has the fields {', '.join(TEMPLATE_FIELDS)} (template required)")
    when = raw.get("when", {})
    if not isinstance(when, dict):
        raise ValueError("a template's when must be a table of axis = [values]")
    problem = when_problem(when)
    if problem:
        raise ValueError(problem)
    return Template(raw["template"], dict(when), source=where)


def when_problem(when: Mapping[str, object]) -> str | None:
    """What is wrong with a ``when`` table's keys and values (an entry's or a template's), if
    anything: each an axis or one of WHEN_KEYS, each given a non-empty list."""
    for axis, values in when.items():
        if axis not in AXES and axis not in WHEN_KEYS:
            return f"when: unknown axis {axis!r} (axes: {', '.join(AXES)}; or {', '.join(WHEN_KEYS)})"
        if not isinstance(values, list) or not values:
            return f"when: {axis} must be a non-empty list of values"
    return None

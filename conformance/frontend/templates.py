"""The failures an xfails entry expects (conformance/frontend/xfails.py): each a table naming
a failure's stable ``code`` and every one of its fields, none of them free, never its message
(messages are for people and may be reworded without touching an entry):

    { code = "<area>.<what>", <field> = <value>, ..., when = { <axis> = [<values>] } }

(docs/codes.md lists the codes and their fields; docs/reports.md has an example).

A field's value is either written as itself (a string, a number, ``nan``, a list), which the
failure's must equal, or constrained:

- ``"{key}"`` (or ``"{key+1}"``, ``"{key-2}"``): the number the kit derived under ``key`` for
  that failure (conformance/checks/derived.py names them: ``expected``, ``unbucketed``, ...);
- ``"{lo..hi}"``: a number within the bounds, inclusive, each a literal (``0``, ``0.05``,
  ``inf``) or a derived ``key`` (``"{1..expected}"``): for what is measured, not derived;
- ``{ one_of = ["a.weight", "b.bias"] }``: one of the values listed (tensor names).

``"{}"`` is refused. A failure whose fields the table does not name one by one, or that has
fields the table does not name, is not the one expected. ``when`` (optional) names the cells
the failure shows in, within its entry's."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from conformance.checks.derived import DERIVED
from conformance.checks.findings import RESERVED, Failure
from conformance.matrix.cells import AXES, Cell

# the number a numeric placeholder captures: an int or decimal, optionally signed, with an
# exponent, or a float that is not finite (a check prints nan and inf as they are)
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
# what ``when`` may name beside the axes: the process group backend of the session (a failure
# that only one backend's devices show: a CUDA-only code path on a gloo world of CPUs)
BACKEND = "backend"
# beside the axes: whether the cell is a simulated world (which checks setup only)
SIMULATED = "simulated"
WHEN_KEYS = (BACKEND, SIMULATED)


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
class Literal:
    """A field's value written as itself: the failure's must equal it (a NaN equals NaN, an
    integer the same float)."""

    value: Any

    def holds(self, value: Any, derived: Mapping[str, float]) -> bool:
        return _same(self.value, value)

    def show(self) -> str:
        return repr(self.value)


@dataclasses.dataclass(frozen=True)
class OneOf:
    """A field's value among those listed (``{ one_of = [...] }``)."""

    values: tuple[Any, ...]

    def holds(self, value: Any, derived: Mapping[str, float]) -> bool:
        return any(_same(v, value) for v in self.values)

    def show(self) -> str:
        return f"one of {len(self.values)}"


@dataclasses.dataclass(frozen=True)
class Number:
    """A field's number constrained by a placeholder (``"{expected}"``, ``"{1..expected-1}"``)."""

    placeholder: Placeholder
    written: str

    def holds(self, value: Any, derived: Mapping[str, float]) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return self.placeholder.holds(str(value), derived)

    def show(self) -> str:
        return self.written


Matcher = Literal | OneOf | Number


def matcher(value: Any, template: str) -> Matcher:
    """How a field's value as written constrains the failure's; ValueError for one refused."""
    if isinstance(value, dict):
        if set(value) != {"one_of"} or not isinstance(value["one_of"], list) or not value["one_of"]:
            raise ValueError(f"template {template}: a table value must be {{ one_of = [values] }}")
        return OneOf(tuple(value["one_of"]))
    if isinstance(value, str) and re.fullmatch(r"\{[^{}]*\}", value.strip()):
        body = value.strip()[1:-1].strip()
        if not body:
            raise ValueError(
                f"template {template}: a free {{}} excuses any number: name what the kit derived "
                '("{expected}") or give a range ("{0..0.05}")'
            )
        return Number(Placeholder.parse(body, template), value.strip())
    if isinstance(value, dict | list) and not _plain(value):
        raise ValueError(f"template {template}: {value!r} is no value a failure holds")
    return Literal(value)


@dataclasses.dataclass(frozen=True)
class Template:
    """One failure an entry expects: its code, a matcher per field, the cells it shows in
    beside the entry's (``when``, {} = all of them) and where it is written (FILE:LINE)."""

    code: str
    fields: dict[str, Matcher] = dataclasses.field(default_factory=dict)
    when: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    source: str = "<xfails>"

    @property
    def text(self) -> str:
        """The template as people read it: its code and fields."""
        return f"{self.code} {{{', '.join(f'{k}={m.show()}' for k, m in self.fields.items())}}}"

    def names(self, cell: Cell, backend: str | None = None) -> bool:
        return when_names(self.when, cell, backend)

    def matches(self, failure: Failure) -> bool:
        """Whether ``failure`` is this one: the same code, the same fields, each as its matcher
        requires (numbers against what the kit derived for that failure)."""
        if failure.code != self.code or set(failure.fields) != set(self.fields):
            return False
        return all(m.holds(failure.fields[k], failure.derived) for k, m in self.fields.items())


def _same(written: Any, value: Any) -> bool:
    if isinstance(written, list) or isinstance(value, list):
        return (
            isinstance(written, list)
            and isinstance(value, list)
            and len(written) == len(value)
            and all(_same(a, b) for a, b in zip(written, value, strict=True))
        )
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (written, value))
    if numbers:
        return written == value or (math.isnan(written) and math.isnan(value))
    return type(written) is type(value) and written == value


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only what a failure's fields hold (strings, numbers, booleans, lists)."""
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, str | int | float | bool)


def when_names(when: Mapping[str, list[str]], cell: Cell, backend: str | None) -> bool:
    on = {BACKEND: backend}
    value = lambda axis: on[axis] if axis in on else getattr(cell, axis)  # noqa: E731
    return all(str(value(axis)) in map(str, values) for axis, values in when.items())


@dataclasses.dataclass(frozen=True)
class Raise:
    """What a cell raised in Thunder's code: the exception's type (``module.Name``, a builtin
    by its name), its message, and the innermost frame of Thunder's on its traceback (the file
    from Thunder's package on, ``thunder/executors/torch_compile.py``, and the function)."""

    type: str
    message: str
    file: str
    function: str


RAISE_FIELDS = ("type", "message", "at")


@dataclasses.dataclass(frozen=True)
class RaiseTemplate:
    """The raise a ``raises`` entry expects: the exception's ``type`` in full, text its message
    holds (a raise's message names what Thunder was compiling, which changes from cell to
    cell), and ``at``, the Thunder frame it comes from: ``thunder/...py`` or
    ``thunder/...py:function``. It matches no failure of a cell that ran to completion."""

    type: str
    message: str
    at: str
    when: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    source: str = "<xfails>"

    @property
    def text(self) -> str:
        return f"raises {self.type} at {self.at}: {self.message!r}"

    def names(self, cell: Cell, backend: str | None = None) -> bool:
        return when_names(self.when, cell, backend)

    def matches(self, failure: Failure) -> bool:
        return False

    def raised(self, raised: Raise) -> bool:
        """Whether ``raised`` is this raise: the same type, from the same frame, its message
        holding this one's text."""
        file, _, function = self.at.partition(":")
        at = raised.file == file and (not function or raised.function == function)
        return raised.type == self.type and self.message in raised.message and at


def raise_of(raw: object, where: str) -> RaiseTemplate:
    """An xfails entry's ``raises`` table; ValueError saying what is wrong with it."""
    if not isinstance(raw, dict) or set(raw) != set(RAISE_FIELDS):
        raise ValueError(f"raises is a table of {', '.join(RAISE_FIELDS)}, each a non-empty string")
    if not all(isinstance(v, str) and v.strip() for v in raw.values()):
        raise ValueError(f"raises: {', '.join(RAISE_FIELDS)} must each be a non-empty string (none is free)")
    if not raw["at"].partition(":")[0].endswith(".py"):
        where_from = "thunder/...py or thunder/...py:function"
        raise ValueError(f"raises: at {raw['at']!r} names no file of Thunder's ({where_from})")
    return RaiseTemplate(raw["type"], raw["message"], raw["at"], source=where)


def template_of(raw: object, where: str) -> Template:
    """One entry of an xfails entry's ``failures``: a {code, fields..., when} table (``code``
    and ``when`` are RESERVED: every other key is a field); ValueError saying what is wrong
    with it."""
    if not isinstance(raw, dict) or not isinstance(raw.get("code"), str) or not raw["code"].strip():
        raise ValueError('each failure is a table { code = "...", <field> = <value>, ..., when = {...} }')
    when = raw.get("when", {})
    if not isinstance(when, dict):
        raise ValueError("a failure's when must be a table of axis = [values]")
    problem = when_problem(when)
    if problem:
        raise ValueError(problem)
    code = raw["code"]
    fields = {k: matcher(v, f"{code} at {where}") for k, v in raw.items() if k not in RESERVED}
    return Template(code, fields, dict(when), source=where)


def when_problem(when: Mapping[str, object]) -> str | None:
    """What is wrong with a ``when`` table's keys and values (an entry's or a template's), if
    anything: each an axis or one of WHEN_KEYS, each given a non-empty list."""
    for axis, values in when.items():
        if axis not in AXES and axis not in WHEN_KEYS:
            return f"when: unknown axis {axis!r} (axes: {', '.join(AXES)}; or {', '.join(WHEN_KEYS)})"
        if not isinstance(values, list) or not values:
            return f"when: {axis} must be a non-empty list of values"
    return None

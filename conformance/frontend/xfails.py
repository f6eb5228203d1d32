"""Known non-conformances of the Thunder under test, read from an xfails file (TOML).

Each ``[[xfail]]`` entry names the check area, the cells it covers (``when``: axis -> values,
and optionally ``backend`` -> the process group backends it holds on), the Thunder versions it
holds for (``thunder``: PEP 440 specifiers, prereleases included), the failures it expects
(each a failure's code and every one of its fields, conformance/frontend/templates.py: no
free number, no free tensor name; never its message, which is for people), a reason and a
link. A failure is explained by an entry iff one of the templates that name its cell has its
code and fields, its numbers the ones the kit derived for it.

Only the failures an entry names become an expected failure: any other failure of the same
item still fails, an item that an entry covers but that conforms fails as well (the entry is
stale), and so does a whole run in which a template matched nothing (frontend/ledger.py).
Where the Thunder version is unknown no entry covers anything. An entry that names the cell
and would explain a failure but holds for other versions only excuses nothing either: the
failing item's message names it (``frontend/known_elsewhere.py``).

A file that cannot be read, is not TOML, or holds an unknown or missing field, a bad template
or a bad specifier raises ``XfailsError`` with one line naming the file and the line.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from conformance.checks.declared import DECLARATIONS
from conformance.checks.findings import Failure
from conformance.checks.registry import AREAS
from conformance.frontend.templates import (
    Raise,
    RaiseTemplate,
    Template,
    raise_of,
    template_of,
    when_names,
    when_problem,
)
from conformance.matrix.cells import Cell
from conformance.matrix.initialization import expects_reset_error

FIELDS = ("area", "when", "thunder", "failures", "reason", "link")
OPTIONAL = ("declares",)  # what the entry declares of the Thunder beside its failures
# a raises entry names the raise its cells end with instead of failures, and every area of
# those cells unless it names one (a cell that raises fails each of its areas' items alike)
RAISES_FIELDS = ("when", "thunder", "raises", "reason", "link")
_HEADER = re.compile(r"^\s*\[\[\s*xfail\s*\]\]")
__all__ = [
    "Expectation",
    "KnownNonConformance",
    "XfailsError",
    "declared",
    "load",
]


class KnownNonConformance(AssertionError):
    """Raised for an item whose every failure an xfails entry expects."""


class XfailsError(ValueError):
    """An xfails file that cannot be used; its message is one line naming the file."""


@dataclasses.dataclass(frozen=True)
class Expectation:
    area: str | None  # None: every area (a raises entry's default)
    when: dict[str, list[str]]
    failures: list[dict[str, Any]]  # as written: {code, fields..., when}; empty in a raises entry
    reason: str
    link: str
    thunder: list[str]
    source: str = "<xfails>"  # FILE:LINE of the entry's [[xfail]] header
    # behaviours the other areas' derivations take as given where the entry holds
    # (conformance/checks/declared.py)
    declares: list[str] = dataclasses.field(default_factory=list)
    # the raise the entry's cells end with, as written: {type, message, at} (None: failures)
    raises: dict[str, str] | None = None
    templates: tuple[Template | RaiseTemplate, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.templates:
            if self.raises is not None:
                expected: tuple[Template | RaiseTemplate, ...] = (raise_of(self.raises, self.source),)
            else:
                expected = tuple(template_of(f, self.source) for f in self.failures)
            object.__setattr__(self, "templates", expected)

    def holds_for(self, thunder_version: str | None) -> bool:
        """Whether any of the entry's specifiers contains ``thunder_version`` (prereleases
        included). An unknown or unparsable version is contained by none."""
        if thunder_version is None:
            return False
        try:
            version = Version(thunder_version)
        except InvalidVersion:
            return False
        return any(SpecifierSet(spec, prereleases=True).contains(version) for spec in self.thunder)

    def covers(self, cell: Cell, area: str, thunder_version: str | None, backend: str | None = None) -> bool:
        """Whether the entry holds for ``cell``'s ``area`` on this Thunder version and, where
        the entry names backends, on the session's ``backend``."""
        return self.holds_for(thunder_version) and self.names(cell, area, backend)

    def names(self, cell: Cell, area: str, backend: str | None = None) -> bool:
        """Whether the entry names ``cell``'s ``area`` (and the session's ``backend``, where it
        names backends), whatever Thunder versions it holds for. A raises entry never names a
        negative cell: such a cell gets no model to run, only its refusal is judged."""
        if self.raises is not None and expects_reset_error(cell):
            return False
        return self.area in (None, area) and when_names(self.when, cell, backend)

    def templates_for(self, cell: Cell | None, backend: str | None = None) -> list[int]:
        """The indices of the templates that name ``cell`` (all of them where it is None)."""
        return [i for i, t in enumerate(self.templates) if cell is None or t.names(cell, backend)]

    def matching(self, failure: Failure, cell: Cell | None = None, backend: str | None = None) -> list[int]:
        """The indices of the templates (among those naming ``cell``) that explain ``failure``:
        its code and fields, its numbers checked against what the kit derived for it."""
        return [i for i in self.templates_for(cell, backend) if self.templates[i].matches(failure)]

    def explains(self, failure: Failure, cell: Cell | None = None, backend: str | None = None) -> bool:
        return bool(self.matching(failure, cell, backend))

    def raising(self, raised: Raise, cell: Cell | None = None, backend: str | None = None) -> list[int]:
        """The indices of the raise templates (among those naming ``cell``) that ``raised`` is."""
        return [i for i in self.raise_templates_for(cell, backend) if self.templates[i].raised(raised)]  # type: ignore[union-attr]

    def raise_templates_for(self, cell: Cell, backend: str | None = None) -> list[int]:
        """The indices of the raise templates that name ``cell``."""
        return [i for i in self.templates_for(cell, backend) if isinstance(self.templates[i], RaiseTemplate)]


def declared(entries: list[Expectation], cell: Cell, thunder_version: str | None, backend: str | None) -> list[str]:
    """What the entries holding for ``cell`` on this Thunder version (and ``backend``) declare
    of it, whatever their area: a declaration is about the Thunder, not about one check."""
    return sorted(
        {d for e in entries if e.holds_for(thunder_version) and when_names(e.when, cell, backend) for d in e.declares}
    )


def _header_lines(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), start=1) if _HEADER.match(line)]


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _entry(raw: Any, where: str, template_sources: list[str] | None = None) -> Expectation:
    def bad(why: str) -> XfailsError:
        return XfailsError(f"xfails file {where}: {why}")

    if not isinstance(raw, dict):
        raise bad("an [[xfail]] entry must be a table")
    if "raises" in raw and "failures" in raw:
        raise bad("an entry names failures or a raise, not both")
    required = RAISES_FIELDS if "raises" in raw else FIELDS
    known = (*required, *OPTIONAL, *(("area",) if "raises" in raw else ()))
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)} (fields: {', '.join(FIELDS + OPTIONAL + ('raises',))})")
    missing = [f for f in required if f not in raw]
    if missing:
        raise bad(f"missing field(s) {', '.join(missing)}")
    for field in ("area", "reason", "link"):
        if field in raw and (not isinstance(raw[field], str) or not raw[field].strip()):
            raise bad(f"{field} must be a non-empty string")
    if "area" in raw and raw["area"] not in AREAS:
        raise bad(f"unknown area {raw['area']!r} (areas: {', '.join(AREAS)})")
    when = raw["when"]
    if not isinstance(when, dict):
        raise bad("when must be a table of axis = [values]")
    problem = when_problem(when)
    if problem:
        raise bad(problem)
    if (
        not isinstance(raw["thunder"], list)
        or not raw["thunder"]
        or not all(isinstance(x, str) for x in raw["thunder"])
    ):
        raise bad("thunder must be a non-empty list of strings")
    for spec in raw["thunder"]:
        if not spec.strip():
            raise bad("thunder: an empty specifier would hold for every version")
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise bad(f"thunder: {spec!r} is not a PEP 440 version specifier (e.g. '==0.2.6')") from None
    declares = raw.get("declares", [])
    if not isinstance(declares, list) or not all(isinstance(d, str) for d in declares):
        raise bad("declares must be a list of strings")
    if undeclarable := [d for d in declares if d not in DECLARATIONS]:
        known = ", ".join(f"{k} ({v})" for k, v in DECLARATIONS.items())
        raise bad(f"declares: unknown {', '.join(map(repr, undeclarable))} (known: {known})")
    if "raises" in raw:
        try:
            expected = raise_of(raw["raises"], where)
        except ValueError as exc:
            raise bad(str(exc)) from None
        return Expectation(**{"area": None, "failures": [], **raw}, source=where, templates=(expected,))
    failures = raw["failures"]
    if not isinstance(failures, list) or not failures:
        raise bad("failures must be a non-empty list of {code, fields..., when} tables")
    sources = list(template_sources or [])
    sources += [where] * (len(failures) - len(sources))
    templates = []
    for failure, source in zip(failures, sources, strict=False):
        try:
            templates.append(template_of(failure, source))
        except ValueError as exc:
            raise XfailsError(f"xfails file {source}: failures: {exc}") from None
    return Expectation(**raw, source=where, templates=tuple(templates))


def _template_lines(lines: list[str], start: int, end: int, failures: Any, name: str) -> list[str]:
    """FILE:LINE of each template of the entry whose header is line ``start`` (1-based; its
    text ends before line ``end``): the first line from there on that holds the template's
    code, as written in TOML (an inline table is one line, and may share it with the template
    before), past the previous template's; the entry's line where none does."""
    out = []
    text = "\n".join(lines[start - 1 : end - 1])
    at = 0  # where in ``text`` the previous template's code ends
    for raw in failures if isinstance(failures, list) else []:
        code = raw.get("code") if isinstance(raw, dict) else None
        found = start
        if isinstance(code, str):
            quoted = "|".join(map(re.escape, (json.dumps(code), f"'{code}'")))
            written = re.compile(rf"\bcode\s*=\s*(?:{quoted})")
            if (m := written.search(text, at)) is not None:
                found, at = start + text.count("\n", 0, m.start()), m.end()
        out.append(f"{name}:{found}")
    return out


def load(path: Path) -> list[Expectation]:
    """The entries of the xfails file at ``path``, in order; XfailsError if it is unusable."""
    name = _display(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise XfailsError(f"xfails file {name}: cannot be read ({exc.strerror or exc})") from None
    try:
        raw: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise XfailsError(f"xfails file {name}: not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - {"xfail"})
    if unknown:
        raise XfailsError(f"xfails file {name}: unknown top-level key(s) {', '.join(unknown)} (only [[xfail]] entries)")
    entries = raw.get("xfail", [])
    if not isinstance(entries, list):
        raise XfailsError(f"xfails file {name}: xfail must be an array of tables ([[xfail]])")
    lines = _header_lines(text)
    if len(lines) != len(entries):  # headers hidden in strings or written inline: no line to name
        return [_entry(entry, name) for entry in entries]
    rows = text.splitlines()
    ends = [*lines[1:], len(rows) + 1]
    return [
        _entry(entry, f"{name}:{line}", _template_lines(rows, line, end, entry.get("failures"), name))
        if isinstance(entry, dict)
        else _entry(entry, f"{name}:{line}")
        for entry, line, end in zip(entries, lines, ends, strict=True)
    ]

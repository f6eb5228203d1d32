"""Known non-conformances of the Thunder under test, read from an xfails file (TOML).

Each ``[[xfail]]`` entry names the check area, the cells it covers (``when``: axis -> values,
and optionally ``backend`` -> the process group backends it holds on),
the Thunder versions it holds for (``thunder``: PEP 440 specifier strings, any of which may
contain the version under test, prereleases included), the failures it expects, a reason and a
link. Every string of ``failures`` is a template of one whole failure message: literal text in
which ``{}`` stands for exactly one number (an int or a decimal, optionally signed, optionally
with an exponent; or nan, inf) and ``{name}`` for one tensor's name (for a failure that hits
every tensor of a model). A failure is explained by an entry iff its first line matches one
of its templates in full (below it, assert_close's details of the tensors).

Only the failures an entry names become an expected failure: any other failure of the same
item still fails, and an item that an entry covers but that conforms fails as well, naming the
entry as stale. Where the Thunder version is unknown (no package metadata, or not a PEP 440
version) no entry covers anything: every failure then counts, and no entry is called stale.
An entry that names the cell and would explain a failure but holds for other versions only
(a fork's version, say) excuses nothing either: the failing item's message names it
(``known_elsewhere``), so an upstream non-conformance can be told from a new one.

A file that cannot be read, is not TOML, or holds an unknown or missing field, a bad template
or a bad specifier raises ``XfailsError`` with one line naming the file (and the entry's line).
"""

from __future__ import annotations

import dataclasses
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

from conformance.checks.registry import AREAS
from conformance.matrix.cells import AXES, Cell

# what ``{}`` in a template stands for: one int or decimal, optionally signed, with an
# exponent, or a float that is not finite (a check prints nan and inf as they are)
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
PLACEHOLDER = "{}"
# what ``{name}`` stands for: one parameter, buffer or output name (dotted, as checks print it)
NAME = r"[\w.]+"
PLACEHOLDERS = {PLACEHOLDER: NUMBER, "{name}": NAME}
FIELDS = ("area", "when", "thunder", "failures", "reason", "link")
# what ``when`` may name beside the axes: the process group backend of the session (a failure
# that only one backend's devices show: a CUDA-only code path on a gloo world of CPUs)
BACKEND = "backend"
_HEADER = re.compile(r"^\s*\[\[\s*xfail\s*\]\]")


class KnownNonConformance(AssertionError):
    """Raised for an item whose every failure an xfails entry expects."""


class XfailsError(ValueError):
    """An xfails file that cannot be used; its message is one line naming the file."""


def template_pattern(template: str) -> re.Pattern[str]:
    """The regex a failure message must match in full: the literal parts of ``template``
    escaped, each ``{}`` one number. Raises ValueError for any other brace."""
    if not template.strip():
        raise ValueError("a template is empty")
    parts = re.split("(" + "|".join(map(re.escape, PLACEHOLDERS)) + ")", template)
    pattern = []
    for i, part in enumerate(parts):
        if i % 2:  # the separators re.split kept: placeholders
            pattern.append(f"(?:{PLACEHOLDERS[part]})")
        elif "{" in part or "}" in part:
            raise ValueError(f"template {template!r}: a brace other than {{}} (one number) or {{name}} (one name)")
        else:
            pattern.append(re.escape(part))
    return re.compile("".join(pattern))


@dataclasses.dataclass(frozen=True)
class Expectation:
    area: str
    when: dict[str, list[str]]
    failures: list[str]
    reason: str
    link: str
    thunder: list[str]
    source: str = "<xfails>"  # FILE:LINE of the entry's [[xfail]] header
    patterns: tuple[re.Pattern[str], ...] = dataclasses.field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.patterns:
            object.__setattr__(self, "patterns", tuple(template_pattern(t) for t in self.failures))

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
        names backends), whatever Thunder versions it holds for."""
        if area != self.area:
            return False
        on = {BACKEND: backend}
        value = lambda axis: on[axis] if axis in on else getattr(cell, axis)  # noqa: E731
        return all(str(value(axis)) in map(str, values) for axis, values in self.when.items())

    def explains(self, failure: str) -> bool:
        # the first line: assert_close's detail lines below it (mismatch counts, the greatest
        # difference) describe the tensors, not what failed
        head = failure.split("\n", 1)[0]
        return any(pattern.fullmatch(head) for pattern in self.patterns)


def first_sentence(text: str) -> str:
    """Up to the first full stop followed by a capital letter (as findings.md shows reasons)."""
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", text.strip(), maxsplit=1)[0]


@dataclasses.dataclass(frozen=True)
class KnownElsewhere:
    """An entry that names an item's cell and area and would explain some of its unexpected
    failures, but that does not hold for the Thunder under test: a fork, or a version the
    file was not measured on. It excuses nothing; it tells an upstream failure from a new one."""

    entry: str  # FILE:LINE of the entry
    thunder: list[str]  # its specifiers
    explains: list[str]  # the first lines of the failures it would explain
    note: str  # the line the item's failure message carries

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def known_elsewhere(
    cell: Cell,
    area: str,
    thunder_version: str | None,
    backend: str | None,
    entries: list[Expectation],
    unexpected: list[str],
) -> list[KnownElsewhere]:
    """The entries naming ``cell``'s ``area`` that do not hold for ``thunder_version`` but would
    explain some of the ``unexpected`` failures (those no entry holding for it explains), one
    each, in file order."""
    if thunder_version is None:
        tested = "; the version under test is unknown"
    else:
        try:
            Version(thunder_version)
            tested = f", not declared for {thunder_version}"
        except InvalidVersion:
            tested = f"; the version under test is unknown ({thunder_version!r} is not a PEP 440 version)"
    found = []
    for entry in entries:
        if entry.holds_for(thunder_version) or not entry.names(cell, area, backend):
            continue
        explained = [failure.split("\n", 1)[0] for failure in unexpected if entry.explains(failure)]
        if not explained:
            continue
        which = ""
        if len(explained) < len(unexpected):  # name them: the others are new on any version
            quoted = "; ".join(f'"{head}"' for head in explained)
            which = f", for {len(explained)} of the {len(unexpected)} unexpected failures ({quoted})"
        note = f"known on {', '.join(entry.thunder)} ({entry.source}){tested}{which}: {first_sentence(entry.reason)}"
        found.append(KnownElsewhere(entry.source, list(entry.thunder), explained, note))
    return found


def _header_lines(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), start=1) if _HEADER.match(line)]


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _entry(raw: Any, where: str) -> Expectation:
    def bad(why: str) -> XfailsError:
        return XfailsError(f"xfails file {where}: {why}")

    if not isinstance(raw, dict):
        raise bad("an [[xfail]] entry must be a table")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)} (fields: {', '.join(FIELDS)})")
    missing = [f for f in FIELDS if f not in raw]
    if missing:
        raise bad(f"missing field(s) {', '.join(missing)}")
    for field in ("area", "reason", "link"):
        if not isinstance(raw[field], str) or not raw[field].strip():
            raise bad(f"{field} must be a non-empty string")
    if raw["area"] not in AREAS:
        raise bad(f"unknown area {raw['area']!r} (areas: {', '.join(AREAS)})")
    when = raw["when"]
    if not isinstance(when, dict):
        raise bad("when must be a table of axis = [values]")
    for axis, values in when.items():
        if axis not in AXES and axis != BACKEND:
            raise bad(f"when: unknown axis {axis!r} (axes: {', '.join(AXES)}; or {BACKEND})")
        if not isinstance(values, list) or not values:
            raise bad(f"when: {axis} must be a non-empty list of values")
    for field in ("thunder", "failures"):
        if not isinstance(raw[field], list) or not raw[field] or not all(isinstance(s, str) for s in raw[field]):
            raise bad(f"{field} must be a non-empty list of strings")
    for spec in raw["thunder"]:
        if not spec.strip():
            raise bad("thunder: an empty specifier would hold for every version")
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise bad(f"thunder: {spec!r} is not a PEP 440 version specifier (e.g. '==0.2.6')") from None
    try:
        patterns = tuple(template_pattern(t) for t in raw["failures"])
    except ValueError as exc:
        raise bad(f"failures: {exc}") from None
    return Expectation(**raw, source=where, patterns=patterns)


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
        lines = [None] * len(entries)
    return [_entry(entry, f"{name}:{line}" if line else name) for entry, line in zip(entries, lines, strict=True)]

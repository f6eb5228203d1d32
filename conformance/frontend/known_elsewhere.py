"""Entries that name a failing item's cell and would explain its failure but hold for other
Thunder versions (a fork, a version the file was not measured on): they excuse nothing, but
the item's message names them, so a maintainer can tell a known upstream failure from a new
one (conformance/frontend/xfails.py reads the entries)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from packaging.version import InvalidVersion, Version

from conformance.checks.findings import Failure
from conformance.frontend.templates import Raise
from conformance.frontend.xfails import Expectation
from conformance.matrix.cells import Cell


def head(failure: str) -> str:
    """A failure's first line: what ``KnownElsewhere.explains`` lists."""
    return failure.split("\n", 1)[0]


def explains_all(found: list[KnownElsewhere], unexpected: list[str]) -> bool:
    """Whether the entries ``found`` explain every one of the ``unexpected`` failures between
    them: the item's failure is then upstream's, none of it new."""
    heads = {h for k in found for h in k.explains}
    return all(head(failure) in heads for failure in unexpected)


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
    unexpected: list[Failure],
) -> list[KnownElsewhere]:
    """The entries naming ``cell``'s ``area`` that do not hold for ``thunder_version`` but would
    explain some of the ``unexpected`` failures (those no entry holding for it explains), one
    each, in file order."""
    tested = _tested(thunder_version)
    found = []
    for entry in entries:
        if entry.holds_for(thunder_version) or not entry.names(cell, area, backend):
            continue
        explained = [head(failure.message) for failure in unexpected if entry.explains(failure, cell, backend)]
        if not explained:
            continue
        which = ""
        if len(explained) < len(unexpected):  # name them: the others are new on any version
            quoted = "; ".join(f'"{head}"' for head in explained)
            which = f", for {len(explained)} of the {len(unexpected)} unexpected failures ({quoted})"
        found.append(KnownElsewhere(entry.source, list(entry.thunder), explained, _note(entry, tested + which)))
    return found


def raise_known_elsewhere(
    cell: Cell, area: str, thunder_version: str | None, backend: str | None, entries: list[Expectation], raised: Raise
) -> list[KnownElsewhere]:
    """The raises entries naming ``cell``'s ``area`` that do not hold for ``thunder_version``
    but expect the raise the cell ended with, one each, in file order."""
    tested = _tested(thunder_version)
    return [
        KnownElsewhere(
            entry.source, list(entry.thunder), [f"{raised.type}: {head(raised.message)}"], _note(entry, tested)
        )
        for entry in entries
        if not entry.holds_for(thunder_version)
        and entry.names(cell, area, backend)
        and entry.raising(raised, cell, backend)
    ]


def _tested(thunder_version: str | None) -> str:
    """How a note says the version under test is not among the entry's."""
    if thunder_version is None:
        return "; the version under test is unknown"
    try:
        Version(thunder_version)
    except InvalidVersion:
        return f"; the version under test is unknown ({thunder_version!r} is not a PEP 440 version)"
    return f", not declared for {thunder_version}"


def _note(entry: Expectation, said: str) -> str:
    return f"known on {', '.join(entry.thunder)} ({entry.source}){said}: {first_sentence(entry.reason)}"

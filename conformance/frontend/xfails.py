"""Known non-conformances of the Thunder under test, read from an xfails file (TOML).

An entry names the check area, the cells it covers (``when``: axis -> values), the failure
messages it expects (substrings), a reason and a link, and optionally the Thunder versions it
applies to. Only the failures it names become an expected failure: any other failure of the
same item still fails, and an item that passes in spite of an entry is an unexpected pass.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from conformance.matrix.cells import Cell


class KnownNonConformance(AssertionError):
    """Raised for an item whose every failure an xfails entry expects."""


@dataclasses.dataclass(frozen=True)
class Expectation:
    area: str
    when: dict[str, list[str]]
    failures: list[str]
    reason: str
    link: str
    thunder: str | None = None

    def covers(self, cell: Cell, area: str, thunder_version: str | None) -> bool:
        if area != self.area:
            return False
        if self.thunder is not None and thunder_version is not None:
            from packaging.specifiers import SpecifierSet

            if thunder_version not in SpecifierSet(self.thunder, prereleases=True):
                return False
        return all(str(getattr(cell, axis)) in map(str, values) for axis, values in self.when.items())

    def explains(self, failure: str) -> bool:
        return any(pattern in failure for pattern in self.failures)


def load(path: Path) -> list[Expectation]:
    raw: dict[str, Any] = tomllib.loads(path.read_text())
    return [Expectation(**entry) for entry in raw.get("xfail", [])]

"""``--affected-by CHANGE --coverage-map REPORT``: only the cells that a change to Thunder can
reach, by the coverage map of an earlier run (conformance/reports/coverage_map.py).

A cell is kept when the map says it ran a line the change touched (on the diff's old side:
the map was made of the source before the change), or when the map cannot say: a cell the map
has no lines for (it was not in that run, or its rank died), or a changed file the map did not
trace (a change outside Thunder's distributed stack may reach every cell). The others are left
out, and the report says how many and why.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from conformance.reports.changed_lines import from_path_lines, from_unified_diff
from conformance.reports.coverage_map import CoverageMap, ranges


@dataclasses.dataclass(frozen=True)
class Affected:
    change: str  # what was given: a diff's path, or PATH:LINES
    changed: dict[str, set[int]]  # Thunder-relative path -> lines of the mapped source
    cmap: CoverageMap
    map_path: str

    @property
    def untraced(self) -> list[str]:
        """Changed files the map did not trace: every cell may run them."""
        return sorted(p for p in self.changed if p not in self.cmap.files)

    def reaches(self, cell_id: str) -> bool:
        if self.untraced or cell_id not in self.cmap.cells or cell_id in self.cmap.unknown:
            return True
        return any(cell_id in self.cmap.cells_running(path, lines) for path, lines in self.changed.items())

    def note(self, kept: int, left_out: int) -> dict[str, Any]:
        """report.json's ``affected_by``."""
        return {
            "change": self.change,
            "map": self.map_path,
            "changed": {p: ranges(ls) for p, ls in sorted(self.changed.items())},
            "cells_kept": kept,
            "cells_left_out": left_out,
            "why": "left out: the map says they run none of the changed lines"
            + (f"; every cell kept: {', '.join(self.untraced)} not in the map" if self.untraced else ""),
        }


def read_map(map_path: Path) -> CoverageMap:
    """``--coverage-map``'s map, or one usage-error line (exit 4)."""
    try:
        return CoverageMap.load(map_path)
    except (OSError, ValueError, KeyError) as exc:
        raise pytest.UsageError(f"--coverage-map {map_path}: no coverage map there ({exc})") from None


def load(change: str, map_path: Path | None, cmap: CoverageMap | None = None) -> Affected:
    """The option's value, or one usage-error line (exit 4): never a silent full run.
    ``cmap``: the map at ``map_path`` where it was read already."""
    if map_path is None:
        raise pytest.UsageError("--affected-by needs --coverage-map REPORT, a --thunder-coverage run's report folder")
    if cmap is None:
        cmap = read_map(map_path)
    path = Path(change)
    try:
        changed = from_unified_diff(path.read_text(), side="old") if path.is_file() else from_path_lines(change)
    except ValueError as exc:
        raise pytest.UsageError(f"--affected-by {exc}") from None
    if not changed:
        raise pytest.UsageError(f"--affected-by {change}: changes no line")
    return Affected(change, changed, cmap, str(map_path))

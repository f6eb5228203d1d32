"""--memory-baseline: a cell's measured peaks against those of an earlier report.json."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.checks.margins import SLACK_BYTES

GROWTH = 0.10  # a phase's peak may grow this much over the baseline (plus SLACK_BYTES)


def load(path: Path | None) -> dict[str, dict[str, int]]:
    """cell id -> phase -> peak bytes, from the memory items of a report (empty without one)."""
    if path is None:
        return {}
    cells = json.loads(path.read_text())["cells"]
    return {
        c["cell"]: c["metrics"]["measured"] for c in cells if c.get("area") == "memory" and "measured" in c["metrics"]
    }


def grown(before: dict[str, int] | None, measured: dict[str, int]) -> list[str]:
    """Phases whose peak grew past GROWTH over ``before`` (the cell's baseline peaks, if any)."""
    if before is None:
        return []
    return [
        f"{phase} peak grew from {before[phase]} to {now} bytes (more than {GROWTH:.0%} over the baseline)"
        for phase, now in measured.items()
        if phase in before and now > before[phase] * (1 + GROWTH) + SLACK_BYTES
    ]

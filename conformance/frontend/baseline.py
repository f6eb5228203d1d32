"""--baseline: the run in progress against an earlier report. A memory item fails where a
phase's measured peak grew beyond run-to-run noise over the baseline's (the thresholds and
their measurement: ``reports/noise.py``); the whole comparison goes to summary.md and
compare.json at session end, where capability lost sets exit status 1 (``reports/writer.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.reports.comparison import UnreadableReport, metrics, read_report
from conformance.reports.noise import MEMORY, noise


def load(path: Path | None) -> dict[str, dict[str, int]]:
    """cell id -> phase -> measured peak bytes, from the memory items of a report (empty
    without one). An unreadable report ends the run before any world starts (exit 4)."""
    if path is None:
        return {}
    try:
        report = read_report(path)
    except UnreadableReport as e:
        raise pytest.UsageError(f"--baseline {e}") from None
    peaks: dict[str, dict[str, int]] = {}
    for (cell, area, metric), (_, value) in metrics(report["cells"]).items():
        if area == MEMORY and metric.endswith(" peak"):
            peaks.setdefault(cell, {})[metric.removesuffix(" peak")] = value
    return peaks


def grown(before: dict[str, int] | None, measured: dict[str, int]) -> list[str]:
    """Phases whose peak grew beyond noise over ``before`` (the cell's baseline peaks, if any)."""
    if before is None:
        return []
    found = []
    for phase, now in measured.items():
        threshold = noise(MEMORY, f"{phase} peak")
        if phase in before and now > before[phase] and threshold.beyond(before[phase], now):
            found.append(
                f"{phase} peak grew from {before[phase]} to {now} bytes over the baseline "
                f"(run-to-run noise: {threshold.describe()})"
            )
    return found


def selects_all(config: pytest.Config) -> bool:
    """Whether the run asks for the whole suite of its profile: no -k, -m, --deselect, --lf,
    --cells or --affected-by, and no path but the suite's folder. Only then does a baseline's
    item missing from the run mean that the item vanished, rather than that it was not asked for."""
    option = config.option
    if option.keyword or option.markexpr or option.deselect or getattr(option, "lf", False):
        return False
    if option.cells or option.affected_by:
        return False
    suite = {config.rootpath, config.rootpath / "conformance"}
    return all((config.invocation_params.dir / arg).resolve() in suite for arg in config.args)

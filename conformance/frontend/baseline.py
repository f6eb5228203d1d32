"""--baseline: the run in progress against an earlier report. Each area that judges a cell
against an earlier run of it (``Area.against_baseline``) gets that run's metrics of the cell
and the run-to-run noise of each (the thresholds and their measurement: ``reports/noise.py``);
the whole comparison goes to summary.md and compare.json at session end, where capability
lost sets exit status 1 (``reports/writer.py``).
The cells that failed or regressed there run first, and its times order the rest
(conformance/matrix/order.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conformance.checks.area import Area
from conformance.checks.findings import Failure, Findings
from conformance.matrix.cost import measured_seconds
from conformance.reports.comparison import UnreadableReport, metrics, read_report
from conformance.reports.noise import noise


@dataclasses.dataclass(frozen=True)
class Baseline:
    """What the run reads of an earlier report: each cell's metrics per area (the areas judge
    them), which cells failed or moved there (they run first) and what each cell took (the
    order's costs)."""

    # (cell, area) -> metric -> (its kind of noise, its value): what reports/comparison.py reads
    metrics: dict[tuple[str, str], dict[str, tuple[str, float]]] = dataclasses.field(default_factory=dict)
    first: frozenset[str] = frozenset()  # cells that failed, erred or regressed beyond noise there
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # cell -> its items' time there


def load(path: Path | None) -> Baseline:
    """The baseline of ``path`` (empty without one). An unreadable report ends the run before
    any world starts (exit 4). A compare.json beside it (that run's own comparison with its
    baseline) adds the cells whose numbers regressed beyond noise there."""
    if path is None:
        return Baseline()
    try:
        report = read_report(path)
    except UnreadableReport as e:
        raise pytest.UsageError(f"--baseline {e}") from None
    measured: dict[tuple[str, str], dict[str, tuple[str, float]]] = {}
    for (cell, area, metric), (kind, value) in metrics(report["cells"]).items():
        if area is not None:
            measured.setdefault((cell, area), {})[metric] = (kind, value)
    first = {c["cell"] for c in report["cells"] if c.get("cell") and c["outcome"] in ("failed", "error")}
    first |= _regressed((path if path.is_dir() else path.parent) / "compare.json")
    return Baseline(measured, frozenset(first), measured_seconds(report["cells"]))


def _regressed(compare: Path) -> set[str]:
    """The cells a comparison found worse beyond noise (an unreadable one adds none: it only
    orders the run)."""
    try:
        data = json.loads(compare.read_text())
        return {m["cell"] for m in data["metrics"] if m.get("regression")} | {
            c["cell"] for c in data["items"] if c.get("regression") and c.get("cell")
        }
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def judged(area: Area, cell: str, before: Baseline, now: Findings) -> list[Failure]:
    """What ``area`` finds of ``cell`` against the baseline's run of it (nothing where the area
    does not judge baselines or the baseline did not run the cell)."""
    earlier = before.metrics.get((cell, area.name))
    if area.against_baseline is None or earlier is None:
        return []
    values = {metric: value for metric, (_, value) in earlier.items()}
    return area.against_baseline(values, now, lambda metric: noise(earlier[metric][0], metric))


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

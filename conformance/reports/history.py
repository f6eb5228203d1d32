"""Nights side by side: every cell's memory peaks (setup, forward, backward) and run time
across a folder of nightly report folders, as one picture.

Each cell is a line, divided by its own value on the first night it ran, so cells of every
size share one axis and a cell that moves stands out; cells that left the noise band
(``noise.py``) on their last night are named beside their line.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

from conformance.reports.comparison import UnreadableReport, metrics, read_report
from conformance.reports.noise import MEMORY, TIMING, noise

PANELS = (
    ("setup peak", MEMORY),
    ("forward peak", MEMORY),
    ("backward peak", MEMORY),
    ("cell_run_s", TIMING),
)
NAMED = 8  # cells named per panel, the farthest from their first night first


@dataclasses.dataclass(frozen=True)
class Night:
    label: str  # the report folder's name
    started: float  # seconds since the epoch: the report's start, else its file's mtime
    report: dict[str, Any]
    # the night's mutation analysis (python -m conformance.mutants: mutants.json's score),
    # where its folder holds one
    mutants: dict[str, Any] | None = None


def nights(folder: Path) -> list[Night]:
    """The report folders directly under ``folder``, oldest first. Folders without a
    report.json (a run that was killed) are left out; an unreadable report.json is an error."""
    if not folder.is_dir():
        raise UnreadableReport(f"{folder}: not a folder")
    found = []
    for sub in sorted(p for p in folder.iterdir() if (p / "report.json").is_file()):
        report = read_report(sub)
        scored = sub / "mutants.json"
        mutants = json.loads(scored.read_text()).get("score") if scored.is_file() else None
        found.append(Night(sub.name, _started(report, sub / "report.json"), report, mutants))
    if not found:
        raise UnreadableReport(f"{folder}: no report folder (a folder holding report.json) in it")
    return sorted(found, key=lambda n: n.started)


def _started(report: dict[str, Any], file: Path) -> float:
    try:
        return datetime.datetime.fromisoformat(report["started"]).timestamp()
    except (KeyError, TypeError, ValueError):  # reports before "started": the file's time
        return file.stat().st_mtime


def series(runs: list[Night], metric: str) -> dict[str, list[float | None]]:
    """cell -> the metric on each night (None where the cell did not run it)."""
    per_night = [
        {key[0]: value for key, (_, value) in metrics(n.report["cells"]).items() if key[2] == metric} for n in runs
    ]
    cells = sorted({c for night in per_night for c in night})
    return {c: [night.get(c) for night in per_night] for c in cells}


def history_figure(runs: list[Night], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(runs)))
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(max(8, 1.2 * len(runs) + 6), 4 * len(PANELS)))
    for ax, (metric, kind) in zip(axes, PANELS, strict=True):
        moved = []
        for cell, values in series(runs, metric).items():
            first = next((v for v in values if v is not None), None)
            if not first:  # nothing to divide by (a peak of 0 bytes): plotted nowhere
                continue
            points = [(x, v / first) for x, v in zip(xs, values, strict=True) if v is not None]
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", ms=3, lw=0.8, alpha=0.5)
            last = next(v for v in reversed(values) if v is not None)
            if noise(kind, metric).beyond(first, last):
                moved.append((abs(last / first - 1), cell, points[-1]))
        for _, cell, (x, y) in sorted(moved, reverse=True)[:NAMED]:
            ax.annotate(cell, (x, y), fontsize="x-small", xytext=(4, 0), textcoords="offset points")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{metric}: each cell ÷ its first night ({len(moved)} beyond noise on its last night)")
        ax.set_xticks(xs, [n.label for n in runs], rotation=30, ha="right")
    env = runs[-1].report.get("environment") or {}
    fig.suptitle(f"{len(runs)} nights, last on Thunder {env.get('thunder', '?')}, {env.get('backend', '?')}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

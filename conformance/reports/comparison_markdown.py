"""A comparison of two runs as Markdown: regressions first, then what else changed, then the
noise thresholds it was judged by."""

from __future__ import annotations

from collections.abc import Iterable

from conformance.reports.comparison import KINDS, LISTED, Comparison, ItemChange, MetricChange, RunInfo
from conformance.reports.noise import MEMORY, TIMING, thresholds

TITLES = {
    "newly failing": "Newly failing",
    "newly erroring": "Newly erroring",
    "fixed": "Fixed",
    "new xpass": "New XPASSes",
    "outcome changed": "Other outcome changes",
    "new item": "New items",
    "vanished": "Vanished items",
}


def markdown(comparison: Comparison, heading: str = "##") -> str:
    """The comparison under one heading of level ``heading`` (its parts one level below)."""
    sub = heading + "#"
    lines = [f"{heading} Runs compared", "", _run("old", comparison.old), _run("new", comparison.new), ""]
    if comparison.old.profile != comparison.new.profile:
        lines += [f"The profiles differ ({comparison.old.profile} → {comparison.new.profile}).", ""]
    n = comparison.regressions
    lines += [f"**{n} regression{'s' if n != 1 else ''}**" if n else "**No regression.**", ""]
    for kind in KINDS:
        changes = [c for c in comparison.items if c.kind == kind]
        if changes:
            cells = len({c.cell or c.item for c in changes})
            count = f"{len(changes)} items, {cells} cells" if cells != len(changes) else str(len(changes))
            lines += [f"{sub} {TITLES[kind]} ({count})", "", *_items(changes), ""]
    if comparison.metrics:
        lines += [f"{sub} Metrics beyond noise ({len(comparison.metrics)})", "", *_metrics(comparison.metrics), ""]
    else:
        lines += [f"{sub} Metrics beyond noise", "", "None: every metric both runs have is within noise.", ""]
    lines += [
        f"{sub} Noise thresholds",
        "",
        "A metric counts as changed where the difference between the runs is beyond its run-to-run "
        "noise, measured over repeated ci runs (`conformance/reports/noise.py`):",
        "",
        *(f"- {what}: {n.describe()}" for what, n in thresholds().items()),
        "",
    ]
    return "\n".join(lines)


def _run(side: str, run: RunInfo) -> str:
    counts = ", ".join(f"{v} {k}" for k, v in sorted(run.counts.items()))
    started = f", started {run.started}" if run.started else ""
    return (
        f"- {side}: `{run.name}`: Thunder {run.thunder or '?'}, {run.backend or '?'}, "
        f"profile {run.profile or '?'}{started}; {run.items} items ({counts})"
    )


def _items(changes: list[ItemChange]) -> list[str]:
    if changes[0].kind in ("new item", "vanished"):  # by cell: a cell comes or goes with all its areas
        by_cell: dict[str, list[str]] = {}
        for c in changes:
            outcome = c.new or c.old or "?"
            by_cell.setdefault(c.cell or c.item, []).append(f"{c.area} ({outcome})" if c.area else outcome)
        return _capped([f"- `{cell}`: {', '.join(areas)}" for cell, areas in by_cell.items()])
    return _capped(
        [f"- `{c.cell or c.item}`{f' ({c.area})' if c.area else ''}: {c.old or 'absent'} → {c.new}" for c in changes]
    )


def _metrics(changes: list[MetricChange]) -> list[str]:
    rows = [
        f"| {'⬆️ worse' if m.regression else '⬇️ better'} | `{m.cell}` | {m.area or _whole(m)} | {m.metric} "
        f"| {_value(m.kind, m.old)} | {_value(m.kind, m.new)} | {_change(m)} |"
        for m in changes
    ]
    return ["| | cell | area | metric | old | new | change |", "|---|---|---|---|---|---|---|", *_capped(rows)]


def _whole(m: MetricChange) -> str:
    """What a metric of no area is of: a cell's run, or an item that is no cell's."""
    return "item" if m.metric == "duration" else "cell"


def _value(kind: str, value: float) -> str:
    if kind == TIMING:
        return f"{value:.2f} s"
    return f"{value:,.0f} B" if kind == MEMORY else f"{value:,.0f}"


def _change(m: MetricChange) -> str:
    diff = m.new - m.old
    if m.kind == TIMING:
        return f"×{m.new / m.old:.2f}" if m.old > 0 else f"{diff:+.2f} s"
    relative = f" ({diff / m.old:+.0%})" if m.old else ""
    return f"{diff:+,.0f}{' B' if m.kind == MEMORY else ''}{relative}"


def _capped(lines: Iterable[str]) -> list[str]:
    lines = list(lines)
    if len(lines) <= LISTED:
        return lines
    return [*lines[:LISTED], "", f"… and {len(lines) - LISTED} more (the JSON lists all)."]

"""A comparison of two runs as Markdown: regressions first (capability lost leading), the
accepted ones, then what else changed, then the noise thresholds it was judged by."""

from __future__ import annotations

from collections.abc import Iterable

from conformance.reports.comparison import (
    CAPABILITY_LOST,
    KINDS,
    LISTED,
    REGRESSIONS,
    Comparison,
    ItemChange,
    MetricChange,
    RunInfo,
)
from conformance.reports.noise import MEMORY, TIMING, thresholds

TITLES = {
    "capability lost": "Capability lost: no longer passing",
    "vanished": "Capability lost: vanished",
    "newly failing": "Newly failing",
    "newly erroring": "Newly erroring",
    "fixed": "Fixed",
    "new xpass": "New XPASSes",
    "outcome changed": "Other outcome changes",
    "new item": "New items",
    "faulted by --chaos": "Faulted by --chaos (a rank lost as planned)",
}


def markdown(comparison: Comparison, heading: str = "##", note: str | None = None) -> str:
    """The comparison under one heading of level ``heading`` (its parts one level below);
    ``note`` follows the count of regressions."""
    sub = heading + "#"
    lines = [f"{heading} Runs compared", "", _run("old", comparison.old), _run("new", comparison.new), ""]
    if comparison.old.profile != comparison.new.profile:
        lines += [f"The profiles differ ({comparison.old.profile} → {comparison.new.profile}).", ""]
    n = comparison.regressions
    accepted = [c for c in [*comparison.items, *comparison.metrics] if c.regression and c.accepted]
    lines += [
        (f"**{n} regression{'s' if n != 1 else ''}**" if n else "**No regression.**")
        + (f" ({len(accepted)} accepted)" if accepted else ""),
        "",
        *([note, ""] if note else []),
    ]
    for kind in KINDS:
        if kind == KINDS[len(REGRESSIONS)] and (accepted or comparison.unused):
            lines += [f"{sub} Accepted ({len(accepted)})", "", *_accepted(comparison), ""]
        changes = [c for c in comparison.items if c.kind == kind and not c.accepted]
        if changes:
            cells = len({c.cell or c.item for c in changes})
            count = f"{len(changes)} items, {cells} cells" if cells != len(changes) else str(len(changes))
            lines += [f"{sub} {TITLES[kind]} ({count})", "", *_capped(f"- {e}" for e in _entries(changes)), ""]
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


def _accepted(comparison: Comparison) -> list[str]:
    """The regressions that an accepted pattern names, each with its kind; then the patterns
    that named none."""
    lines = [
        f"- {kind}: {entry}"
        for kind in REGRESSIONS
        for entry in _entries([c for c in comparison.items if c.kind == kind and c.accepted])
    ]
    lines += [
        f"- metric beyond noise: `{m.cell}` ({m.area or _whole(m)}) {m.metric}: "
        f"{_value(m.kind, m.old)} → {_value(m.kind, m.new)} ({_change(m)})"
        for m in comparison.metrics
        if m.regression and m.accepted
    ]
    return [*_capped(lines), *(f"- accepted but unchanged: `{p}`" for p in comparison.unused)]


def _entries(changes: list[ItemChange]) -> list[str]:
    """One entry a change, or a cell's changes in one (all of the same kind)."""
    if not changes:
        return []
    if changes[0].kind in ("new item", "vanished"):  # by cell: a cell comes or goes with all its areas
        by_cell: dict[str, list[str]] = {}
        for c in changes:
            outcome = c.new or c.old or "?"
            by_cell.setdefault(c.cell or c.item, []).append(f"{c.area} ({outcome})" if c.area else outcome)
        return [f"`{cell}`: {', '.join(areas)}" for cell, areas in by_cell.items()]
    if changes[0].kind == CAPABILITY_LOST:  # by cell too: a composition lost is lost in every area
        areas: dict[tuple[str, str | None, str | None, str | None], list[str]] = {}
        for c in changes:
            areas.setdefault((c.cell or c.item, c.old, c.new, c.reason), []).append(c.area or "")
        return [
            f"`{cell}`{_areas(a)}: {old} → {new}{f': {reason}' if reason else ''}"
            for (cell, old, new, reason), a in areas.items()
        ]
    return [
        f"`{c.cell or c.item}`{f' ({c.area})' if c.area else ''}: {c.old or 'absent'} → {c.new}"
        + (f" (known on {c.known_on})" if c.known_on else "")
        for c in changes
    ]


def _areas(areas: list[str]) -> str:
    return f" ({', '.join(areas)})" if any(areas) else ""


def _metrics(changes: list[MetricChange]) -> list[str]:
    rows = [
        f"| {_direction(m)} | `{m.cell}` | {m.area or _whole(m)} | {m.metric} "
        f"| {_value(m.kind, m.old)} | {_value(m.kind, m.new)} | {_change(m)} |"
        for m in changes
    ]
    return ["| | cell | area | metric | old | new | change |", "|---|---|---|---|---|---|---|", *_capped(rows)]


def _direction(m: MetricChange) -> str:
    if not m.regression:
        return "⬇️ better"
    return "⬆️ worse, accepted" if m.accepted else "⬆️ worse"


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

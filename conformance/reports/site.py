"""The dashboard: a static site over a folder of report folders (nights, or one per Thunder
version): index.html with the runs-by-areas table, each run's regressions and fixes against
the run before it, and the history as inline SVG charts; beside it each run's report.html.

Which change is a regression is the comparison's (``comparison.compare``, noise from
``noise.py``), and the runs, their order and the metrics pictured are the history's
(``history.nights``, ``history.series``): this module only lays them out.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

from conformance.reports.comparison import FIXED, VANISHED, Comparison, ItemChange, MetricChange, compare
from conformance.reports.history import PANELS, Night, nights, series
from conformance.reports.html import document, page
from conformance.reports.noise import noise
from conformance.reports.svg import Line, line_chart

SHOWN = ("passed", "xfailed", "failed")  # the table's counts; error, unsupported and skipped beside them
COUNTED = ("passed", "xfailed", "failed", "error", "unsupported")  # the history of counts
COLORS = {"passed": "#2a7", "xfailed": "#d90", "failed": "#c33", "error": "#84c", "unsupported": "#888"}
PARTIAL = "This run asked for part of the suite: what the run before ran and it did not is not counted as vanished."
NAMED = 8  # cells named per metric chart: those farthest beyond noise on their last run


@dataclasses.dataclass(frozen=True)
class Step:
    """One run against the run before it: what regressed and what was fixed."""

    night: Night
    comparison: Comparison
    regressions: list[ItemChange | MetricChange]
    fixes: list[ItemChange]
    partial: bool  # a run of part of the suite: what it did not run is not counted as vanished


def build(folder: Path, out: Path) -> Path:
    """Write the site for the report folders under ``folder`` to ``out``; its index.html."""
    runs = nights(folder)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for night in runs:
        own = folder / night.label / "report.html"  # the run's own page knows every item's repro
        target = out / "runs" / f"{night.label}.html"
        if own.is_file():
            shutil.copyfile(own, target)
        else:
            target.write_text(page(night.report))
    index = out / "index.html"
    index.write_text(document(f"Thunder conformance: {len(runs)} runs", _index(folder, runs, steps(runs))))
    return index


def steps(runs: list[Night]) -> list[Step]:
    """Each run after the first compared with the one before it."""
    found = []
    for old, new in itertools.pairwise(runs):
        comparison = compare(old.report, new.report, old.label, new.label)
        partial = new.report.get("whole_run") is False
        regressions: list[ItemChange | MetricChange] = [
            c for c in comparison.items if c.regression and not (partial and c.kind == VANISHED)
        ]
        regressions += [m for m in comparison.metrics if m.regression]
        fixes = [c for c in comparison.items if c.kind == FIXED]
        found.append(Step(new, comparison, regressions, fixes, partial))
    return found


def area_counts(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    """area -> outcome -> items (items of no area, such as generated models, under "other")."""
    counts: dict[str, dict[str, int]] = {}
    for item in report["cells"]:
        per = counts.setdefault(item.get("area") or "other", {})
        per[item["outcome"]] = per.get(item["outcome"], 0) + 1
    return counts


def _index(folder: Path, runs: list[Night], changes: list[Step]) -> str:
    e = html.escape
    parts = [
        f"<header><h1>Thunder conformance: {len(runs)} runs</h1><p>From <code>{e(str(folder))}</code>, oldest "
        "first (by each report's start). Each run's own page: its name in the table.</p></header><main>",
        "<h2>Runs × areas</h2>",
        _table(runs),
        "<h2>Regressions and fixes against the run before</h2>",
    ]
    if not changes:
        parts.append("<p>One run: nothing to compare with.</p>")
    for step in changes:
        parts.append(_step(step))
    parts += ["<h2>History</h2>", *_charts(runs), "</main>"]
    return "\n".join(parts)


def _table(runs: list[Night]) -> str:
    e = html.escape
    per_run = [area_counts(n.report) for n in runs]
    areas = list(dict.fromkeys(a for counts in per_run for a in counts))
    head = "".join(f"<th>{e(a)}</th>" for a in areas)
    scored = any(n.mutants for n in runs)
    score_head = "<th>mutants: silent score</th>" if scored else ""
    rows = [
        f'<table id="runs"><tr><th>run</th><th>Thunder</th><th>profile</th><th>started</th>{head}<th>all</th>'
        f"{score_head}</tr>"
    ]
    for night, counts in zip(runs, per_run, strict=True):
        env = night.report.get("environment") or {}
        cells = "".join(_counts(counts.get(a, {}), a) for a in areas)
        total: dict[str, int] = {}
        for per in counts.values():
            for o, n in per.items():
                total[o] = total.get(o, 0) + n
        rows.append(
            f'<tr data-run="{e(night.label)}"><td><a href="runs/{quote(night.label)}.html">{e(night.label)}</a></td>'
            f"<td>{e(str(env.get('thunder', '?')))}</td><td>{e(str(night.report.get('profile', '?')))}</td>"
            f"<td>{e(str(night.report.get('started', '?')))}</td>{cells}{_counts(total, 'all')}"
            f"{_score(night.mutants) if scored else ''}</tr>"
        )
    rows.append(
        "</table><p>passed / xfailed / failed per area; errors (the kit's), unsupported and skipped beside.</p>"
    )
    return "\n".join(rows)


def _score(score: dict[str, Any] | None) -> str:
    """The night's mutation analysis: silently-wrong kills of the mutants that kept Thunder running."""
    if not score or score.get("silent_score") is None:
        return "<td>–</td>"
    return f"<td>{100 * score['silent_score']:.0f}% ({score['silently_wrong']} of {score['kept_running']})</td>"


def _counts(counts: dict[str, int], area: str) -> str:
    if not counts:  # the run has no item of this area
        return f'<td class="o none" data-area="{html.escape(area)}">–</td>'
    main = " / ".join(str(counts.get(o, 0) + (counts.get("xpassed", 0) if o == "passed" else 0)) for o in SHOWN)
    rest = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()) if o not in (*SHOWN, "xpassed"))
    worst = (
        "failed" if counts.get("failed") or counts.get("error") else "xfailed" if counts.get("xfailed") else "passed"
    )
    tip = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
    extra = f"<br><small>{html.escape(rest)}</small>" if rest else ""
    return f'<td class="o {worst}" data-area="{html.escape(area)}" title="{html.escape(tip)}">{main}{extra}</td>'


def _step(step: Step) -> str:
    e = html.escape
    c = step.comparison
    title = (
        f"{e(c.new.name)} (Thunder {e(str(c.new.thunder))}) against {e(c.old.name)} (Thunder {e(str(c.old.thunder))})"
    )
    parts = [
        f'<section class="changes" data-run="{e(step.night.label)}" data-regressions="{len(step.regressions)}" '
        f'data-fixes="{len(step.fixes)}"><h3>{title}</h3>'
    ]
    if step.partial:
        parts.append(f"<p>{e(PARTIAL)}</p>")
    if not step.regressions and not step.fixes:
        parts.append("<p>No regression, no fix.</p>")
    if step.regressions:
        parts.append(f'<p class="regression">Regressions ({len(step.regressions)}):</p><ul>')
        parts += [f'<li class="regression">{_change(r, step.night.label)}</li>' for r in step.regressions]
        parts.append("</ul>")
    if step.fixes:
        parts.append(f'<p class="fix">Fixed ({len(step.fixes)}):</p><ul>')
        parts += [f'<li class="fix">{_change(f, step.night.label)}</li>' for f in step.fixes]
        parts.append("</ul>")
    return "\n".join([*parts, "</section>"])


def _change(change: ItemChange | MetricChange, run: str) -> str:
    e = html.escape
    cell = change.cell or getattr(change, "item", "")
    link = f'<a class="id" href="runs/{quote(run)}.html#cell={quote(cell, safe="")}">{e(cell)}</a>'
    area = f" ({e(change.area)})" if change.area else ""
    if isinstance(change, MetricChange):
        beyond = e(change.noise.describe())
        return f"{link}{area} {e(change.metric)}: {change.old:,.6g} → {change.new:,.6g} (beyond {beyond})"
    why = f": {e(change.reason)}" if change.reason else ""
    known = f" (known on {e(change.known_on)})" if change.known_on else ""
    old, new = e(str(change.old or "absent")), e(str(change.new or "absent"))
    return f"{e(change.kind)}: {link}{area}: {old} → {new}{why}{known}"


def _charts(runs: list[Night]) -> list[str]:
    labels = [n.label for n in runs]
    counts = [n.report.get("counts") or {} for n in runs]
    charts = [
        line_chart(
            "items per outcome",
            labels,
            [
                Line(o, [float(c.get(o, 0)) for c in counts], COLORS[o])
                for o in COUNTED
                if any(c.get(o) for c in counts)
            ],
        )
    ]
    for metric, kind in PANELS:
        lines = []
        for cell, values in series(runs, metric).items():
            first = next((v for v in values if v is not None), None)
            if not first:  # nothing to divide by (a peak of 0 bytes)
                continue
            last = next(v for v in reversed(values) if v is not None)
            moved = noise(kind, metric).beyond(first, last)
            relative = [None if v is None else v / first for v in values]
            lines.append((abs(last / first - 1) if moved else -1.0, cell, relative))
        named = {cell for distance, cell, _ in sorted(lines, reverse=True)[:NAMED] if distance >= 0}
        shown = [Line(cell, values, None if cell in named else "#bbb", cell in named) for _, cell, values in lines]
        moved = len([1 for d, _, _ in lines if d >= 0])
        title = f"{metric}: each cell ÷ its first run ({moved} beyond noise on its last)"
        charts.append(line_chart(title, labels, sorted(shown, key=lambda line: line.named)))
    return charts

"""summary.md: one row per cell and one column per check area, the coverage of every axis
value, the highest memory ratios, the simulated worlds, every failure with a one-line repro,
the known non-conformances and the unexpected passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conformance.matrix.cells import AXES, axis_value
from conformance.reports import coverage_map, simulated, time_share
from conformance.reports.outcomes import MARKS, triage_line


def summary(
    report: dict[str, Any], repro: Callable[[str], str], figure: str | None = None, scale: str | None = None
) -> str:
    """The markdown; ``figure`` and ``scale`` name memory.png and scale.png where written."""
    env = report["environment"]
    cells = [c for c in report["cells"] if "axes" in c]
    by_cell: dict[str, dict[str, Any]] = {}
    areas: list[str] = []
    for c in cells:
        row = by_cell.setdefault(c["cell"], {"axes": c["axes"]})
        row[c["area"]] = c["outcome"]
        if c["area"] not in areas:
            areas.append(c["area"])
    varying = [a for a in AXES if len({str(axis_value(r["axes"], a)) for r in by_cell.values()}) > 1]
    first = next(iter(by_cell.values()))["axes"] if by_cell else {}
    fixed = {a: axis_value(first, a) for a in AXES if a not in varying} if by_cell else {}
    counts = ", ".join(
        f"{n} {k}" + (triage_line(report.get("failures")) if k == "failed" else "")
        for k, n in sorted(report["counts"].items())
    )
    src = env["thunder_source"]
    lines = [
        "# Thunder distributed conformance",
        "",
        *_warnings(report.get("warnings", [])),
        f"Thunder {env['thunder']} ({src.get('spec') or 'the kit pin'}; from {src.get('installed_from')}), "
        f"torch {env['torch']}, backend {env['backend']}, {env['world_size']} ranks: "
        f"**{counts}** in {report['wall_s']:.1f} s (exit status {report['exit_status']}).",
        "",
    ]
    lines += _chaos(report.get("chaos"))
    lines += time_share.section(report.get("time_share"))
    if fixed:
        lines += ["Every cell: " + ", ".join(f"{k}={v}" for k, v in fixed.items()) + ".", ""]
    if by_cell:
        lines.append("| " + " | ".join([*varying, *areas]) + " |")
        lines.append("|" + "---|" * (len(varying) + len(areas)))
        for row in by_cell.values():
            marks = [MARKS.get(row.get(a, ""), "–") for a in areas]
            lines.append("| " + " | ".join([*(str(axis_value(row["axes"], a)) for a in varying), *marks]) + " |")
        lines.append("")
    lines += [f"Profile **{report['profile']}**; cells that ran (not unsupported) per axis value:", ""]
    lines += [
        f"- {axis}: " + ", ".join(f"{value} {n}" for value, n in values.items())
        for axis, values in report["coverage"].items()
    ]
    lines += ["", *_unmet(report["coverage"], report["unmet_pairs"])]
    lines += _unmet_contract(report.get("unmet_contract"))
    lines += _memory(report, figure)
    lines += simulated.section(report, scale)
    lines += coverage_map.section(report.get("thunder_coverage"))
    for outcome, title in (
        ("failed", "Failures: Thunder does not conform"),
        ("error", "Errors: the kit broke, not Thunder (no verdict on these items)"),
    ):
        items = [c for c in report["cells"] if c["outcome"] == outcome]
        if items:
            lines += [f"## {title}", ""]
            for c in items:
                first = (c.get("message") or "").strip().splitlines()[:12]
                # what xfails entries for other Thunder versions would explain, though the findings fill the lines
                first += [k["note"] for k in c.get("known_elsewhere", []) if k["note"] not in first]
                lines += [f"### `{c['id']}`", "", "```", *first, "```", "", f"Repro: `{repro(c['id'])}`", ""]
    stale = (report.get("xfail_templates") or {}).get("stale", [])
    if stale:
        lines += ["## Stale xfails templates: the run fails", ""]
        lines += [
            f"- `{s['template']}` (entry `{s['entry']}`): `{s['text']}` matched no failure of the "
            f"{s['items']} items it names: remove it, or narrow its `when`"
            for s in stale
        ]
        lines.append("")
    xfailed = [c for c in report["cells"] if c["outcome"] == "xfailed"]
    if xfailed:
        lines += ["## Known non-conformances (xfails file)", ""]
        reasons: dict[str, int] = {}
        for c in xfailed:
            reasons[c.get("xfail_reason", "")] = reasons.get(c.get("xfail_reason", ""), 0) + 1
        lines += [f"- {n} items: {reason}" for reason, n in reasons.items()]
        lines.append("")
    return "\n".join(lines)


def _warnings(warnings: list[str]) -> list[str]:
    """Above everything else: a green table under these did not test what it seems to."""
    if not warnings:
        return []
    return [*(f"> ⚠️ **{w}**" for w in warnings), ""]


def _unmet(coverage: dict[str, dict[str, int]], unmet: list[dict[str, Any]], shown: int = 30) -> list[str]:
    """The pairs of axis values that met in no cell that ran; those of a value that ran in no
    cell at all (an unsupported composition) counted in one line."""
    if not unmet:
        return ["Every pair of values of two axes met in a cell that ran.", ""]
    lines = [f"{len(unmet)} pairs of axis values met in no cell that ran:", ""]
    never = {(a, str(v)) for a, values in coverage.items() for v, n in values.items() if n == 0}
    rest = []
    for value in sorted(never):
        pairs = [p for p in unmet if any((a, str(v)) == value for a, v in p.items())]
        lines.append(f"- {value[0]}={value[1]} ran in no cell: its {len(pairs)} pairs")
    for pair in unmet:
        if not any((a, str(v)) in never for a, v in pair.items()):
            rest.append(" × ".join(f"{a}={v}" for a, v in pair.items()))
    lines += [f"- {p}" for p in rest[:shown]]
    if len(rest) > shown:
        lines.append(f"- … and {len(rest) - shown} more (report.json: unmet_pairs)")
    lines.append("")
    return lines


def _unmet_contract(unmet: list[dict[str, Any]] | None, shown: int = 30) -> list[str]:
    """ci's coverage contract (docs/matrix.md#the-coverage-contract): what no cell that ran
    met, and which profile meets it."""
    if unmet is None:  # a run of part of a profile, or of one not held to it (or from before it)
        return []
    if not unmet:
        return ["Every contracted feature × family × scenario and feature × init met in a cell that ran.", ""]
    lines = [f"{len(unmet)} contracted combinations met in no cell that ran:", ""]
    for item in unmet[:shown]:
        where = f" ({item['covered_by']} covers it)" if "covered_by" in item else ""
        lines.append("- " + " × ".join(f"{a}={v}" for a, v in item.items() if a != "covered_by") + where)
    if len(unmet) > shown:
        lines.append(f"- … and {len(unmet) - shown} more (report.json: unmet_contract)")
    lines.append("")
    return lines


PHASES = ("setup", "forward", "backward")


def _memory(report: dict[str, Any], figure: str | None) -> list[str]:
    """Bound / measured per cell and phase (rank 0), with the exact checks' state: the headroom
    a regression has before a bound catches it."""
    rows = []
    for c in report["cells"]:
        metrics = c.get("metrics", {}) if c.get("area") == "memory" else {}
        if not all(f"{p} peak" in metrics for p in PHASES):
            continue
        ratios = [(metrics[f"{p} peak"] or {}).get("bound / measured") for p in PHASES]
        held = [
            all(h.get("measured") == h.get("expected") for h in metrics.get(key, []))
            for key in ("held after backward", "held after the step")
        ]
        rows.append((c["cell"], ratios, all(held)))
    if not rows:
        return []
    lines = [
        "## Memory: bound / measured per cell",
        "",
        "Peaks of rank 0 (1.00: measured at the bound); *held exact*: what every backward and every",
        "step left held equals the model's arithmetic to the byte.",
        "",
        "| cell | setup | forward | backward | held exact |",
        "|---|---|---|---|---|",
    ]
    for cell, ratios, exact in rows:
        shown = [f"{r:.2f}" if r is not None else "–" for r in ratios]
        lines.append(f"| `{cell}` | " + " | ".join(shown) + f" | {'yes' if exact else 'no'} |")
    if figure:
        lines += ["", f"![measured against estimated memory]({figure})"]
    return [*lines, ""]


def _chaos(chaos: dict[str, Any] | None) -> list[str]:
    """--chaos: how many cells were faulted, and how many of them said so (report.json: chaos)."""
    if chaos is None:
        return []
    verdicts: dict[str, int] = {}
    for note in chaos["cells"].values():
        for verdict in note["verdicts"]:
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
    told = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) or "none"
    return [f"**--chaos {chaos['seed']}** (share {chaos['share']}): {len(chaos['cells'])} cells faulted: {told}.", ""]


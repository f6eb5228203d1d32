"""summary.md: one row per cell and one column per check area, the coverage of every axis
value, the highest memory ratios, every failure with a one-line repro, the known
non-conformances and the unexpected passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conformance.matrix.cells import AXES
from conformance.reports.outcomes import MARKS


def summary(report: dict[str, Any], repro: Callable[[str], str], figure: str | None = None) -> str:
    env = report["environment"]
    cells = [c for c in report["cells"] if "axes" in c]
    by_cell: dict[str, dict[str, Any]] = {}
    areas: list[str] = []
    for c in cells:
        row = by_cell.setdefault(c["cell"], {"axes": c["axes"]})
        row[c["area"]] = c["outcome"]
        if c["area"] not in areas:
            areas.append(c["area"])
    varying = [a for a in AXES if len({str(r["axes"][a]) for r in by_cell.values()}) > 1]
    fixed = {a: next(iter(by_cell.values()))["axes"][a] for a in AXES if a not in varying} if by_cell else {}
    counts = ", ".join(f"{n} {k}" for k, n in sorted(report["counts"].items()))
    src = env["thunder_source"]
    lines = [
        "# Thunder distributed conformance",
        "",
        f"Thunder {env['thunder']} ({src.get('spec') or 'the kit pin'}; from {src.get('installed_from')}), "
        f"torch {env['torch']}, backend {env['backend']}, {env['world_size']} ranks: "
        f"**{counts}** in {report['wall_s']:.1f} s (exit status {report['exit_status']}).",
        "",
    ]
    if fixed:
        lines += ["Every cell: " + ", ".join(f"{k}={v}" for k, v in fixed.items()) + ".", ""]
    if by_cell:
        lines.append("| " + " | ".join([*varying, *areas]) + " |")
        lines.append("|" + "---|" * (len(varying) + len(areas)))
        for row in by_cell.values():
            marks = [MARKS.get(row.get(a, ""), "–") for a in areas]
            lines.append("| " + " | ".join([*(str(row["axes"][a]) for a in varying), *marks]) + " |")
        lines.append("")
    lines += [f"Profile **{report['profile']}**; cells per axis value:", ""]
    lines += [
        f"- {axis}: " + ", ".join(f"{value} {n}" for value, n in values.items())
        for axis, values in report["coverage"].items()
    ]
    lines.append("")
    ratios = [
        (c["metrics"][key]["ratio"], c["cell"], key)
        for c in report["cells"]
        if c.get("area") == "memory"
        for key in ("setup peak", "forward peak", "backward peak")
        if (c.get("metrics", {}).get(key) or {}).get("ratio") is not None
    ]
    if ratios:
        lines += ["## Memory: highest measured / estimated peaks", "", "| ratio | phase | cell |", "|---|---|---|"]
        lines += [f"| {r:.2f} | {key.split()[0]} | `{cell}` |" for r, cell, key in sorted(ratios, reverse=True)[:8]]
        if figure:
            lines += ["", f"![measured against estimated memory]({figure})"]
        lines.append("")
    failed = [c for c in report["cells"] if c["outcome"] in ("failed", "error")]
    if failed:
        lines += ["## Failures", ""]
        for c in failed:
            first = (c.get("message") or "").strip().splitlines()[:12]
            lines += [f"### `{c['id']}`", "", "```", *first, "```", "", f"Repro: `{repro(c['id'])}`", ""]
    xfailed = [c for c in report["cells"] if c["outcome"] == "xfailed"]
    if xfailed:
        lines += ["## Known non-conformances (xfails file)", ""]
        reasons: dict[str, int] = {}
        for c in xfailed:
            reasons[c.get("xfail_reason", "")] = reasons.get(c.get("xfail_reason", ""), 0) + 1
        lines += [f"- {n} items: {reason}" for reason, n in reasons.items()]
        lines.append("")
    xpassed = [c for c in report["cells"] if c["outcome"] == "xpassed"]
    if xpassed:
        lines += ["## Unexpected passes (an xfails entry no longer needed?)", ""]
        lines += [f"- `{c['id']}`" for c in xpassed]
        lines.append("")
    return "\n".join(lines)

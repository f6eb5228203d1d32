"""Reports: report.jsonl as each item finishes, report.json and summary.md at the end.

Everything is built from pytest's own reports (and the user_properties that each item of
the suite attaches), so the files agree with pytest's exit status and its --junitxml.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conformance import environment
from conformance.cells import AXES, coverage
from conformance.figures import memory_figure
from conformance.plugin import is_unsupported, plain_nodeid

if TYPE_CHECKING:
    from conformance.plugin import Runner

MARKS = {
    "passed": "✅",
    "failed": "❌",
    "skipped": "⏭️",
    "error": "💥",
    "xfailed": "⚠️ xfail",
    "xpassed": "❗ xpass",
    "unsupported": "🚫",
}


def _outcome(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if is_unsupported(report):
        return "unsupported"
    if report.when != "call" and report.failed:
        return "error"
    return report.outcome


class Reporter:
    def __init__(self, report_dir: Path, runner: Runner) -> None:
        self.dir = report_dir
        self.runner = runner
        self.records: dict[str, dict[str, Any]] = {}
        self.started = time.time()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / "report.jsonl"
        self.jsonl.write_text("")

    # A test's record is complete once its last phase (teardown) is reported.
    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = plain_nodeid(report.nodeid)
        rec = self.records.setdefault(nodeid, {"id": nodeid, "outcome": "passed", "duration": 0.0})
        rec["duration"] += report.duration
        for key, value in report.user_properties:
            rec[key] = json.loads(value)
        # the call decides, unless an earlier phase already failed or skipped
        if rec["outcome"] == "passed" and (report.when == "call" or report.failed or report.skipped):
            rec["outcome"] = _outcome(report)
            if report.failed or rec["outcome"] in ("xfailed", "unsupported"):
                rec["message"] = report.longreprtext
            if hasattr(report, "wasxfail"):
                rec["xfail_reason"] = report.wasxfail
        if report.when == "teardown":
            with self.jsonl.open("a") as f:
                f.write(json.dumps(rec) + "\n")

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        records = list(self.records.values())
        counts: dict[str, int] = {}
        for rec in records:
            counts[rec["outcome"]] = counts.get(rec["outcome"], 0) + 1
        report = {
            "environment": environment.describe(self.runner.backend, self.runner.nproc),
            "exit_status": int(exitstatus),
            "wall_s": time.time() - self.started,
            # every world start is charged to the one cell that needed it (xdist workers too)
            "profile": self.runner.profile,
            "coverage": coverage(self.runner.cells),
            "xfails_file": str(self.runner.xfails_file),
            "worlds_started": len({r["cell"] for r in records if r.get("metrics", {}).get("world_start_s", 0) > 0}),
            "isolate": self.runner.isolate,
            "counts": counts,
            "cells": records,
        }
        (self.dir / "report.json").write_text(json.dumps(report, indent=2))
        figure = "memory.png" if memory_figure(report, self.dir / "memory.png") else None
        (self.dir / "summary.md").write_text(summary(report, self.runner.repro, figure))


def summary(report: dict[str, Any], repro: Any, figure: str | None = None) -> str:
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

"""The report writer: report.jsonl as each item finishes, report.json, summary.md, report.html
(the page: conformance/reports/html.py), memory.png and (with simulated cells) scale.png at
the end; with a baseline report,
compare.json and the comparison appended to summary.md, and exit status 1 where a capability
was lost over the baseline and nothing else failed.

Everything is built from pytest's own reports (and the user_properties that each item of
the suite attaches), so the files agree with pytest's exit status and its --junitxml.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

import pytest

from conformance.matrix.axes import PROBED_AXES
from conformance.matrix.cells import Cell
from conformance.matrix.contract import unmet_contract
from conformance.matrix.coverage import coverage, unmet_pairs
from conformance.matrix.profiles import cells as profile_cells
from conformance.reports import coverage_map, environment, json_text
from conformance.reports.comparison import VANISHED, Comparison, ItemChange, compare, read_report
from conformance.reports.comparison_markdown import markdown
from conformance.reports.figures import memory_figure
from conformance.reports.html import page
from conformance.reports.outcomes import cell_of, message, outcome, plain_nodeid, triage
from conformance.reports.scale import scale_figure
from conformance.reports.session import SessionInfo
from conformance.reports.summary import summary
from conformance.reports.time_share import time_share

# the profiles whose cells the coverage contract speaks of (conformance/matrix/contract.py)
CONTRACTED_PROFILES = ("ci", "nightly", "full")
PART_OF_SUITE = "This run asked for part of the suite: the baseline's items it did not run set no exit status."
STOPPED = "This run stopped early (-x, or interrupted): the baseline's items it did not reach set no exit status."


class Judged(Protocol):
    """What the report writes of per template staleness (conformance/frontend/ledger.py's Ledger)."""

    def to_json(self) -> dict[str, Any]: ...


class Reporter:
    def __init__(
        self,
        report_dir: Path,
        session: SessionInfo,
        baseline: Path | None = None,
        whole_run: bool = True,
        ledger: Judged | None = None,
        run_warnings: list[str] | None = None,
    ) -> None:
        self.dir = report_dir
        self.session = session
        # a run of part of the suite (-k, a path) misses the baseline's other items without losing them
        self.whole_run = whole_run
        self.ledger = ledger  # judged before this writer's session end (its hook runs first)
        # the runner's, filled as the run goes (a composition probe that failed, say)
        self.run_warnings = run_warnings if run_warnings is not None else []
        # read now: the run may write its report.json over the baseline's (the same folder)
        self.baseline = (str(baseline), read_report(baseline)) if baseline is not None else None
        self.records: dict[str, dict[str, Any]] = {}
        self.cells_not_collected: list[str] | None = None
        self.affected_by: dict[str, Any] | None = None  # --affected-by's selection, set at collection
        self.started = time.time()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / "report.jsonl"
        self.jsonl.write_text("")
        # an earlier run's reports must not pass for this run's where this one dies before writing
        for name in WHOLE_FILES:
            (self.dir / name).unlink(missing_ok=True)
        if session.thunder_coverage is not None:  # an earlier run's rank data must not join this run's
            shutil.rmtree(session.thunder_coverage, ignore_errors=True)

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Under --cells, which asked-for cells the profile had no item for (an xdist controller
        collects nothing itself: it says nothing then)."""
        if self.session.cells is None or not session.items:
            return
        collected = {cell.id for item in session.items if (cell := cell_of(item)) is not None}
        self.cells_not_collected = [c for c in self.session.cells if c not in collected]

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
            rec["outcome"] = outcome(report)
            if report.failed or rec["outcome"] in ("xfailed", "unsupported"):
                rec["message"] = message(report)
            if hasattr(report, "wasxfail"):
                rec["xfail_reason"] = report.wasxfail
        if report.when == "teardown":
            # when the item ended, from the run's start: how soon a run told of each verdict
            rec["ended_s"] = time.time() - self.started
            with self.jsonl.open("a") as f:
                f.write(json_text.dumps(rec) + "\n")

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # the ledger's stale templates may have set it after pytest passed ``exitstatus``
        exitstatus = getattr(session, "exitstatus", exitstatus)
        # -x (or a Ctrl-C) ended the run early: what its cells left unmet says nothing of the
        # profile, and asking nightly's array for it would cost half a minute after the verdict
        stopped = bool(getattr(session, "shouldfail", False) or getattr(session, "shouldstop", False))
        complete = self.whole_run and not stopped  # every cell of the profile asked for and reached
        records = list(self.records.values())
        counts: dict[str, int] = {}
        # coverage is of the cells that ran: one reported unsupported tested nothing
        ran = {r["cell"]: Cell(**r["axes"]) for r in records if "axes" in r and r["outcome"] != "unsupported"}
        for rec in records:
            counts[rec["outcome"]] = counts.get(rec["outcome"], 0) + 1
        sizes = {c.world_size for c in ran.values() if not c.simulated}
        report = {
            "environment": environment.describe(self.session),
            # what the run did not test although its environment suggests it did (summary.md's top)
            "warnings": environment.warnings(self.session, sizes) + self.run_warnings,
            "exit_status": int(exitstatus),
            # when the run began (UTC): what orders nights in `python -m conformance.compare --history`
            "started": datetime.datetime.fromtimestamp(self.started, datetime.timezone.utc).isoformat(),
            "wall_s": time.time() - self.started,
            # every world start is charged to the one cell that needed it (xdist workers too)
            "profile": self.session.profile,
            # False where -k, -m or a path narrowed the run, or it stopped early: its cells are
            # not the profile's (what a later comparison or the dashboard must not call vanished)
            "whole_run": complete,
            "coverage": coverage(ran.values(), self.session.nproc),
            "unmet_pairs": unmet_pairs(ran.values(), self.session.nproc, profile=self.session.profile),
            "unmet_contract": contract_left(list(ran.values()), self.session, complete),
            "xfails_file": str(self.session.xfails_file),
            "worlds_started": len({r["cell"] for r in records if r.get("metrics", {}).get("world_start_s", 0) > 0}),
            "isolate": self.session.isolate,
            "time_share": time_share(records).to_json(),
            # per template staleness (frontend/ledger.py): whether it was judged, and the stale ones
            "xfail_templates": self.ledger.to_json() if self.ledger is not None else None,
            "counts": counts,
            # which failures are new, which an entry for other Thunder versions explains
            "failures": triage(records),
            "cells": records,
        }
        if self.affected_by is not None:
            report["affected_by"] = self.affected_by
        if self.session.chaos is not None:
            report["chaos"] = chaos_account(self.session.chaos, records)
        if self.session.cells is not None:
            report["cells_asked"] = list(self.session.cells)
            report["cells_not_collected"] = self.cells_not_collected
        if self.session.thunder_coverage is not None:
            report["thunder_coverage"] = self._thunder_coverage(records)
        comparison = None
        if self.baseline is not None:
            name, old = self.baseline
            comparison = compare(old, report, name, str(self.dir))
            lost = lost_over_baseline(comparison, complete)
            if lost and exitstatus == pytest.ExitCode.OK:
                # every item conformed or was excused, but something that conformed no longer does
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
                report["exit_status"] = int(session.exitstatus)
                terminal = session.config.pluginmanager.get_plugin("terminalreporter")
                if terminal is not None:
                    cells = len({c.cell or c.item for c in lost})
                    terminal.write_line(
                        f"exit status 1: {len(lost)} items of {cells} cells lost a capability over the baseline "
                        f"(summary.md: Capability lost)"
                    )
        _whole(self.dir / "report.json", json_text.dumps(report, indent=2))
        figure = "memory.png" if memory_figure(report, self.dir / "memory.png") else None
        scale = "scale.png" if scale_figure(report, self.dir / "scale.png") else None
        text = summary(report, self.session.repro, figure, scale)
        if comparison is not None:
            _whole(self.dir / "compare.json", json_text.dumps(comparison.to_json(), indent=2))
            note = PART_OF_SUITE if not self.whole_run else STOPPED if stopped else None
            text = text.rstrip("\n") + "\n\n" + markdown(comparison, note=note)
        _whole(self.dir / "summary.md", text)
        _whole(self.dir / "report.html", page(report, self.session.repro))

    def _thunder_coverage(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """--thunder-coverage: the ranks' data combined into the coverage map and coverage's HTML
        (conformance/reports/coverage_map.py), the Thunder found where the ranks found it."""
        package = environment.thunder_package()
        data_dir = self.session.thunder_coverage
        assert package is not None and data_dir is not None, "no Thunder to map"
        version = environment.version(environment.THUNDER_DIST) or "unknown"
        return coverage_map.write(data_dir, self.dir, package, version, records)


# the files written once, at the run's end, each whole or not at all (``_whole``)
WHOLE_FILES = ("report.json", "compare.json", "summary.md", "report.html")


def _whole(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a run killed while writing leaves no half a file
    (the text goes to a file beside it, renamed over ``path`` once complete)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def chaos_account(chaos: tuple[int, float], records: list[dict[str, Any]]) -> dict[str, Any]:
    """--chaos: per faulted cell, the fault planned there and what became of it in its items
    (frontend/chaos.py names the verdicts: lost as planned, not reached, lost but misreported)."""
    cells: dict[str, dict[str, Any]] = {}
    for rec in records:
        if "chaos" in rec:
            note = cells.setdefault(rec["cell"], {"fault": rec["chaos"]["fault"], "verdicts": []})
            if rec["chaos"]["verdict"] not in note["verdicts"]:
                note["verdicts"].append(rec["chaos"]["verdict"])
    return {"seed": chaos[0], "share": chaos[1], "cells": cells}


def contract_left(ran: list[Cell], session: SessionInfo, whole_run: bool) -> list[dict[str, Any]] | None:
    """ci's coverage contract (features x family x scenario, features x special inits) that the
    cells left unmet; for a ci run that left some, nightly's cells (over the values that ran: a
    probed value no cell ran was refused) say which of them nightly meets. None for a run that
    says nothing of it: part of a profile (-k, a path, stopped by -x), or smoke and scale, which
    are not held to it (and building every model to ask would cost seconds at every end)."""
    if not whole_run or session.profile not in CONTRACTED_PROFILES:
        return None
    nightly = None
    if session.profile == "ci":
        unmet = unmet_contract(ran, session.nproc)
        if not unmet:
            return unmet
        counts = coverage(ran, session.nproc)
        refused = {v: "" for axis in PROBED_AXES for v, n in counts[axis].items() if n == 0}
        # a run in which no composition ran (every cell refused, or none reported) has no
        # nightly to point to
        ran_any = any(n for n in counts["composition"].values())
        nightly = (
            [c for c in profile_cells("nightly", session.nproc, refused) if c.composition not in refused]
            if ran_any
            else []
        )
    return unmet_contract(ran, session.nproc, profile=session.profile, nightly=nightly)


def lost_over_baseline(comparison: Comparison, whole_run: bool) -> list[ItemChange]:
    """What a run lost over its baseline (``Comparison.capability_lost``): an item missing from a
    run of part of the suite is left out, it was not asked for."""
    return [c for c in comparison.capability_lost if whole_run or c.kind != VANISHED]

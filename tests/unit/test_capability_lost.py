"""Capability lost (issue 26) on items of a real ci report: passed -> xfailed, unsupported or
gone is a regression of ``python -m conformance.compare`` and of the run-time --baseline (exit
1, listed first), --accept lists an intended one and leaves it uncounted, and a partial or
stopped run calls nothing it did not ask for lost."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.frontend.baseline import selects_all
from conformance.reports import environment, writer
from conformance.reports.outcomes import excuse
from conformance.reports.session import SessionInfo
from conformance.reports.writer import PART_OF_SUITE, STOPPED, Reporter
from tests.support.report_data import (
    DDP,
    ENTRY,
    LLAMA,
    NEOX,
    NEOX_NUMERICS,
    NO_EXECUTOR,
    NVFUSER,
    TIED,
    baseline_report,
    ci_report,
    compare_cli,
    degraded,
    find,
    run,
)
from tests.support.suite_runs import ROOT


def test_the_excerpt_is_a_passing_ci_report() -> None:
    rep = ci_report()
    assert rep["profile"] == "ci" and rep["exit_status"] == 0
    assert {find(rep, c, "memory")["outcome"] for c in (NEOX, DDP, LLAMA)} == {"passed"}
    assert {i["outcome"] for i in rep["cells"] if i.get("cell") == NVFUSER} == {"unsupported"}


def test_capability_lost_exits_1_and_leads_naming_all_three(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = compare_cli(tmp_path, capsys, ci_report(), degraded(ci_report()))
    assert status == 1, out
    headings = [line for line in out.splitlines() if line.startswith("### ")]
    assert headings[:2] == [
        "### Capability lost: no longer passing (2)",
        "### Capability lost: vanished (6 items, 1 cells)",
    ]
    assert f"- `{NEOX}` (numerics): passed → xfailed: {ENTRY}" in out
    assert f"- `{DDP}` (memory): passed → unsupported: {NO_EXECUTOR}" in out
    vanished = f"- `{LLAMA}`: collectives (xfailed), materialization (passed), memory (passed)"
    assert vanished in out and out.count(LLAMA) == 1  # the cell once, with its areas
    assert "**8 regressions**" in out


def test_capability_lost_in_the_json(tmp_path: Path) -> None:
    status, _, js = run(tmp_path, ci_report(), degraded(ci_report()))
    assert status == 1 and js["regressions"] == js["capability_lost"] == 8
    lost = {(c["cell"], c["area"]): c for c in js["items"] if c["kind"] == "capability lost"}
    assert lost[(DDP, "memory")]["reason"] == NO_EXECUTOR and lost[(NEOX, "numerics")]["reason"] == ENTRY
    assert {c["cell"] for c in js["items"] if c["kind"] == "vanished"} == {LLAMA}
    assert all(c["regression"] and not c["accepted"] for c in js["items"])


def test_identical_reports_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = compare_cli(tmp_path, capsys, ci_report(), ci_report())
    assert status == 0 and "**No regression.**" in out and "Capability lost" not in out


@pytest.mark.parametrize(
    "accept",
    [
        (NEOX_NUMERICS, DDP, LLAMA),  # an item id (its brackets are no glob), cell ids
        ("numerics", "memory", "litgpt_llama-*"),  # areas (LLAMA's all of its six), a glob
        ("*-tied-*",),  # one glob for all three
    ],
)
def test_accepted_capability_loss_exits_0_and_is_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], accept: tuple[str, ...]
) -> None:
    args = [a for pattern in accept for a in ("--accept", pattern)]
    status, out = compare_cli(tmp_path, capsys, ci_report(), degraded(ci_report()), *args)
    assert status == 0, out
    assert "**No regression.** (8 accepted)" in out and "### Accepted (8)" in out
    assert "### Capability lost" not in out
    assert f"- capability lost: `{NEOX}` (numerics): passed → xfailed: {ENTRY}" in out
    assert f"- capability lost: `{DDP}` (memory): passed → unsupported: {NO_EXECUTOR}" in out
    assert f"- vanished: `{LLAMA}`: collectives (xfailed)" in out
    assert "accepted but unchanged" not in out


def test_accepting_part_leaves_the_rest_and_names_what_matched_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = compare_cli(
        tmp_path, capsys, ci_report(), degraded(ci_report()), "--accept", DDP, "--accept", "*-jit_ddp-*"
    )
    assert status == 1
    assert "**7 regressions** (1 accepted)" in out and "### Accepted (1)" in out
    assert "- accepted but unchanged: `*-jit_ddp-*`" in out and "- accepted but unchanged: `" + DDP not in out
    assert f"- `{NEOX}` (numerics): passed → xfailed" in out

    status, out = compare_cli(tmp_path, capsys, ci_report(), ci_report(), "--accept", "nosuch")
    assert status == 0 and "- accepted but unchanged: `nosuch`" in out


def test_an_accepted_metric_regression_is_listed_not_counted(tmp_path: Path) -> None:
    new = baseline_report()
    find(new, TIED, "memory")["metrics"]["measured"]["backward"] += 4
    status, text, js = run(tmp_path, baseline_report(), new, "--accept", f"{TIED[:7]}*")
    assert status == 0 and js["regressions"] == 0 and js["accepted"] == 1
    assert f"- metric beyond noise: `{TIED}` (memory) backward peak: 92,628 B → 92,632 B (+4 B (+0%))" in text
    assert "⬆️ worse, accepted" in text


def test_failed_to_xfailed_and_a_new_cell_are_no_regression(tmp_path: Path) -> None:
    old, new = ci_report(), ci_report()
    find(old, NEOX, "numerics")["outcome"] = "failed"
    find(new, NEOX, "numerics").update(outcome="xfailed", xfail_reason=ENTRY)
    added = [
        {**copy.deepcopy(i), "id": i["id"].replace(NEOX, NEOX + "-copy"), "cell": NEOX + "-copy"}
        for i in new["cells"]
        if i.get("cell") == NEOX
    ]
    new["cells"] += added
    status, text, js = run(tmp_path, old, new)
    assert status == 0, text
    assert {c["kind"] for c in js["items"]} == {"fixed", "new item"}
    assert f"- `{NEOX}-copy`: collectives (passed)" in text


def test_excuse_reads_the_reason_of_the_real_skip() -> None:
    unsupported = find(ci_report(), NVFUSER, "memory")
    assert excuse(unsupported) == "nvFuser generates CUDA kernels only; this world's device is cpu"
    assert excuse({"outcome": "skipped"}) is None
    assert excuse({"outcome": "unsupported", "message": "unsupported: plain text"}) == "plain text"


class Terminal:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_line(self, line: str) -> None:
        self.lines.append(line)


@pytest.fixture
def no_picture(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's end without memory.png, the contract's section and the scan of installed
    packages for nvFuser: seconds each, and nothing the exit status reads."""
    monkeypatch.setattr(writer, "memory_figure", lambda report, path: False)
    # the coverage contract's section: nightly's covering array, half a minute per excerpt
    monkeypatch.setattr(writer, "contract_left", lambda ran, session, whole_run: None)
    monkeypatch.setattr(environment, "nvfuser", lambda: None)


def finish_against_baseline(
    tmp_path: Path, new: dict[str, Any], exitstatus: int, whole_run: bool = True, shouldfail: str | bool = False
) -> tuple[SimpleNamespace, Terminal]:
    """A Reporter with ``--baseline`` on the excerpt, fed ``new``'s items and ended as pytest
    would end the session with ``exitstatus``: the session as it stands after, what it printed."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "old.json").write_text(json.dumps(ci_report()))
    terminal = Terminal()
    config = SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin={"terminalreporter": terminal}.get))
    session = SimpleNamespace(exitstatus=exitstatus, config=config, shouldfail=shouldfail)
    reporter = Reporter(
        tmp_path / "report",
        SessionInfo("gloo", 2, "ci", False, ROOT / "xfails.toml", True),
        baseline=tmp_path / "old.json",
        whole_run=whole_run,
    )
    for rec in new["cells"]:
        reporter.records[rec["id"]] = rec
    reporter.pytest_sessionfinish(session, exitstatus)  # type: ignore[arg-type]
    return session, terminal


def test_baseline_run_that_lost_a_capability_exits_1(tmp_path: Path, no_picture: None) -> None:
    session, terminal = finish_against_baseline(tmp_path, degraded(ci_report()), 0)
    assert session.exitstatus == 1
    assert json.loads((tmp_path / "report" / "report.json").read_text())["exit_status"] == 1
    assert terminal.lines == [
        "exit status 1: 8 items of 3 cells lost a capability over the baseline (summary.md: Capability lost)"
    ]
    comparison = (tmp_path / "report" / "summary.md").read_text().partition("## Runs compared")[2]
    assert comparison.index("### Capability lost: no longer passing") < comparison.index(
        "### Capability lost: vanished"
    )
    assert next(h for h in comparison.splitlines() if h.startswith("### ")).startswith("### Capability lost")
    assert f"- `{DDP}` (memory): passed → unsupported: {NO_EXECUTOR}" in comparison


def test_baseline_exit_status_only_where_the_run_would_exit_0(tmp_path: Path, no_picture: None) -> None:
    session, terminal = finish_against_baseline(tmp_path / "same", ci_report(), 0)
    assert session.exitstatus == 0 and terminal.lines == []
    session, terminal = finish_against_baseline(tmp_path / "failing", degraded(ci_report()), 1)
    assert session.exitstatus == 1 and terminal.lines == []  # pytest's own status stands
    session, _ = finish_against_baseline(tmp_path / "interrupted", degraded(ci_report()), 2)
    assert session.exitstatus == 2


def test_baseline_items_a_partial_run_did_not_ask_for_set_no_exit_status(tmp_path: Path, no_picture: None) -> None:
    vanished_only = ci_report()
    vanished_only["cells"] = [i for i in vanished_only["cells"] if i.get("cell") != LLAMA]
    session, _ = finish_against_baseline(tmp_path / "part", vanished_only, 0, whole_run=False)
    assert session.exitstatus == 0
    summary = (tmp_path / "part" / "report" / "summary.md").read_text()
    assert PART_OF_SUITE in summary and "### Capability lost: vanished" in summary
    session, _ = finish_against_baseline(tmp_path / "whole", vanished_only, 0, whole_run=True)
    assert session.exitstatus == 1
    session, _ = finish_against_baseline(tmp_path / "lost", degraded(ci_report()), 0, whole_run=False)
    assert session.exitstatus == 1  # what it did run and lost still counts


def test_baseline_items_a_stopped_run_did_not_reach_are_not_called_lost(tmp_path: Path, no_picture: None) -> None:
    # -x ends the run at its first failure: the cells after it vanished from nothing
    unreached = ci_report()
    unreached["cells"] = [i for i in unreached["cells"] if i.get("cell") != LLAMA]
    session, terminal = finish_against_baseline(tmp_path, unreached, 1, shouldfail="stopping after 1 failures")
    assert session.exitstatus == 1 and terminal.lines == []
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert STOPPED in summary and PART_OF_SUITE not in summary
    # and the report says so, for a later comparison and the dashboard
    assert json.loads((tmp_path / "report" / "report.json").read_text())["whole_run"] is False


def suite_config(
    *args: str, keyword: str = "", markexpr: str = "", deselect: list[str] | None = None, **narrowing: Any
) -> Any:
    narrowing = {"cells": None, "affected_by": None, **narrowing}  # --cells, --affected-by
    option = SimpleNamespace(keyword=keyword, markexpr=markexpr, deselect=deselect, lf=False, **narrowing)
    return SimpleNamespace(option=option, args=list(args), rootpath=ROOT, invocation_params=SimpleNamespace(dir=ROOT))


def test_a_run_selects_all_only_without_k_m_deselect_or_a_narrower_path() -> None:
    assert selects_all(suite_config("conformance"))
    assert selects_all(suite_config(str(ROOT / "conformance") + "/"))
    assert selects_all(suite_config(str(ROOT)))
    assert not selects_all(suite_config("conformance", keyword="tied_lm"))
    assert not selects_all(suite_config("conformance", markexpr="not slow"))
    assert not selects_all(suite_config("conformance", deselect=["conformance/test_memory.py"]))
    assert not selects_all(suite_config("conformance/test_memory.py"))
    assert not selects_all(suite_config("conformance", cells=["a-cell"]))
    assert not selects_all(suite_config(f"conformance/test_memory.py::test_memory[{DDP}]"))

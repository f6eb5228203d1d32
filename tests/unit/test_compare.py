"""python -m conformance.compare: two reports compared (regressions exit 1 and are named,
capability lost first; --accept lists an intended one and leaves it uncounted; noise and
identical runs exit 0, unreadable input exits 4 in one line), the history picture, and the
run-time --baseline's comparison in the report folder and its exit status. No world: the
reports are built here in report.json's schema, or trimmed from a real ci report."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.compare import main
from conformance.frontend.baseline import selects_all
from conformance.matrix.cells import Cell
from conformance.reports import environment, history, writer
from conformance.reports.comparison import compare
from conformance.reports.outcomes import excuse
from conformance.reports.session import SessionInfo
from conformance.reports.writer import PART_OF_SUITE, STOPPED, Reporter
from tests.support.suite_runs import ROOT

TIED_CELL = Cell("tied_lm", "real", "fsdp_jit", tie="tied")
MLP_CELL = Cell(
    "mlp", "meta_module_init", "jit_fsdp", offload="all", sharding="zero3", bucketing="block", dtype="bfloat16"
)
TIED, MLP = TIED_CELL.id, MLP_CELL.id
AXES = {cell.id: cell.axes() for cell in (TIED_CELL, MLP_CELL)}
TIMINGS = {"setup_s": 0.05, "step0_s": 6.0, "step1_s": 0.4, "step2_s": 0.3}


def item(cell: str, area: str, outcome: str = "passed", **metrics: Any) -> dict[str, Any]:
    return {
        "id": f"conformance/test_{area}.py::test_{area}[{cell}]",
        "outcome": outcome,
        "duration": 0.001,
        "cell": cell,
        "area": area,
        "axes": AXES[cell],
        "ranks": [{"rank": r, "status": "passed", "failures": []} for r in range(2)],
        "metrics": {"world_start_s": 0.0, "cell_run_s": 9.0, **metrics, "timings": dict(TIMINGS)},
    }


def memory(cell: str, setup: int, forward: int, backward: int, step: int = 0) -> dict[str, Any]:
    measured = {"setup": setup, "forward": forward, "backward": backward, "step": step}
    return item(cell, "memory", measured=measured, **{f"{p} peak": {"measured": v} for p, v in measured.items()})


def collectives(cell: str, forward_all_gathers: int = 6, gathered: int = 3528) -> dict[str, Any]:
    return item(
        cell,
        "collectives",
        **{
            "forward all_gathers": {"expected": 6, "actual": forward_all_gathers},
            "backward reduce_scatters": {"expected": 6, "actual": 6},
            "forward all-gathered bytes": {"expected": 3528, "actual": gathered},
        },
    )


def report(*items: dict[str, Any], started: str = "2026-11-22T01:00:00+00:00") -> dict[str, Any]:
    counts: dict[str, int] = {}
    for i in items:
        counts[i["outcome"]] = counts.get(i["outcome"], 0) + 1
    return {
        "environment": {"thunder": "0.2.7.dev20260201", "backend": "gloo", "world_size": 2},
        "exit_status": 0,
        "started": started,
        "wall_s": 300.0,
        "profile": "ci",
        "counts": counts,
        "cells": list(items),
    }


def baseline_report() -> dict[str, Any]:
    return report(
        memory(TIED, 49636, 91632, 92628, 11400),
        collectives(TIED),
        item(TIED, "numerics"),
        memory(MLP, 1712, 2272, 4000),
        item(MLP, "offload", **{"held after forward": {"measured": 2000, "estimate": 2000, "bound": 2256}}),
        {"id": "conformance/test_generated.py::test_generated_model_conforms", "outcome": "passed", "duration": 21.0},
    )


def find(rep: dict[str, Any], cell: str, area: str) -> dict[str, Any]:
    return next(i for i in rep["cells"] if i.get("cell") == cell and i.get("area") == area)


def run(tmp_path: Path, old: dict[str, Any], new: dict[str, Any], *extra: str) -> tuple[int, str, dict[str, Any]]:
    """Exit status, Markdown and JSON of comparing two reports written as report folders."""
    for name, rep in (("old", old), ("new", new)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "report.json").write_text(json.dumps(rep))
    out = tmp_path / "compare.md"
    status = main(
        [
            str(tmp_path / "old"),
            str(tmp_path / "new"),
            "--markdown",
            str(out),
            "--json",
            str(tmp_path / "c.json"),
            *extra,
        ]
    )
    return status, out.read_text(), json.loads((tmp_path / "c.json").read_text())


def test_a_report_against_itself_is_no_regression(tmp_path: Path) -> None:
    status, text, js = run(tmp_path, baseline_report(), baseline_report())
    assert status == 0 and "**No regression.**" in text
    assert js["regressions"] == 0 and js["items"] == [] and js["metrics"] == []


def test_noise_level_differences_are_no_regression(tmp_path: Path) -> None:
    new = baseline_report()
    # the worst jitter measured between runs: an mlp forward peak 2272 -> 3232 B, a cell x5.39 slower
    find(new, MLP, "memory")["metrics"]["measured"]["forward"] = 3232
    for i in new["cells"]:
        if i.get("cell") == TIED:
            i["metrics"]["cell_run_s"] = 9.0 * 5.39
            i["metrics"]["timings"]["step1_s"] = 0.4 * 9.0
    status, text, js = run(tmp_path, baseline_report(), new)
    assert status == 0, text
    assert js["metrics"] == []


def test_a_planted_memory_regression_exits_1_and_names_the_cell(tmp_path: Path) -> None:
    new = baseline_report()
    find(new, TIED, "memory")["metrics"]["measured"]["backward"] += 4  # CPU peaks repeat to the byte
    status, text, js = run(tmp_path, baseline_report(), new)
    assert status == 1
    assert "**1 regression**" in text
    row = next(line for line in text.splitlines() if "backward peak" in line)
    assert TIED in row and "⬆️ worse" in row and "+4 B" in row
    [change] = js["metrics"]
    assert (change["cell"], change["metric"], change["old"], change["new"], change["regression"]) == (
        TIED,
        "backward peak",
        92628,
        92632,
        True,
    )


def test_forward_peak_beyond_its_measured_jitter_is_a_regression(tmp_path: Path) -> None:
    new = baseline_report()
    find(new, MLP, "memory")["metrics"]["measured"]["forward"] = 2272 + 1100
    status, text, _ = run(tmp_path, baseline_report(), new)
    assert status == 1 and MLP in text and "forward peak" in text


def test_more_collectives_is_a_regression_fewer_an_improvement(tmp_path: Path) -> None:
    more = baseline_report()
    find(more, TIED, "collectives")["metrics"]["forward all_gathers"]["actual"] = 7
    find(more, TIED, "collectives")["metrics"]["forward all-gathered bytes"]["actual"] = 5704
    status, text, js = run(tmp_path, baseline_report(), more)
    assert status == 1
    assert {m["metric"] for m in js["metrics"]} == {"forward all_gathers", "forward all-gathered bytes"}
    assert "+2,176 (+62%)" in text

    status, text, js = run(tmp_path, more, baseline_report())
    assert status == 0 and "⬇️ better" in text and js["regressions"] == 0


def test_timing_far_beyond_noise_is_a_regression(tmp_path: Path) -> None:
    new = baseline_report()
    for i in new["cells"]:
        if i.get("cell") == MLP:
            i["metrics"]["cell_run_s"] = 9.0 * 10
    status, text, js = run(tmp_path, baseline_report(), new)
    assert status == 1
    [change] = js["metrics"]
    assert (change["cell"], change["area"], change["metric"], change["kind"]) == (MLP, None, "cell_run_s", "timing")
    assert "×10.00" in text


@pytest.mark.parametrize(
    ("old", "new", "section", "status"),
    [
        ("passed", "failed", "Newly failing", 1),
        ("xfailed", "failed", "Newly failing", 1),
        ("passed", "error", "Newly erroring", 1),
        ("failed", "error", "Newly erroring", 1),
        ("failed", "passed", "Fixed", 0),
        ("xfailed", "xpassed", "New XPASSes", 0),
        ("passed", "unsupported", "Capability lost: no longer passing", 1),
        ("passed", "xfailed", "Capability lost: no longer passing", 1),
        ("passed", "skipped", "Capability lost: no longer passing", 1),
        ("failed", "xfailed", "Fixed", 0),  # the failure now known: it did not conform before either
        ("failed", "unsupported", "Fixed", 0),
        ("xfailed", "unsupported", "Other outcome changes", 0),
        ("unsupported", "passed", "Other outcome changes", 0),
    ],
)
def test_outcome_changes(tmp_path: Path, old: str, new: str, section: str, status: int) -> None:
    before, after = baseline_report(), baseline_report()
    find(before, TIED, "numerics")["outcome"] = old
    find(after, TIED, "numerics")["outcome"] = new
    got, text, js = run(tmp_path, before, after)
    assert got == status, text
    assert f"### {section} (1)" in text
    assert f"- `{TIED}` (numerics): {old} → {new}" in text
    [change] = js["items"]
    assert (change["cell"], change["area"], change["old"], change["new"]) == (TIED, "numerics", old, new)


def test_new_and_vanished_items_are_named(tmp_path: Path) -> None:
    """A new item is no regression; a vanished one is (capability lost), named once by its cell."""
    old = baseline_report()
    new = copy.deepcopy(old)
    new["cells"] = [i for i in new["cells"] if i.get("cell") != MLP] + [item(TIED, "state_dict")]
    status, text, js = run(tmp_path, old, new)
    assert status == 1, text
    assert "**2 regressions**" in text
    assert f"### New items (1)\n\n- `{TIED}`: state_dict (passed)" in text
    assert f"### Capability lost: vanished (2 items, 1 cells)\n\n- `{MLP}`: memory (passed), offload (passed)" in text
    assert {(c["kind"], c["area"]) for c in js["items"]} == {
        ("new item", "state_dict"),
        ("vanished", "memory"),
        ("vanished", "offload"),
    }


def test_a_new_item_that_fails_is_a_regression(tmp_path: Path) -> None:
    new = baseline_report()
    new["cells"].append(item(TIED, "state_dict", outcome="failed"))
    status, text, _ = run(tmp_path, baseline_report(), new)
    assert status == 1 and f"- `{TIED}` (state_dict): absent → failed" in text


def test_markdown_to_stdout_and_report_files_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text(json.dumps(baseline_report()))
    assert main([str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert "## Runs compared" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no such file"),
        ("folder", "no report.json there"),
        ("{not json", "not JSON"),
        ('{"cells": [{"outcome": "passed"}]}', "not a report of the kit"),
        ("[1, 2]", "not a report of the kit"),
    ],
)
def test_unreadable_input_exits_4_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, says: str
) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(baseline_report()))
    bad = tmp_path / "bad.json"
    if content == "folder":
        bad.mkdir()
    elif content is not None:
        bad.write_text(content)
    assert main([str(good), str(bad)]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ERROR: ") and says in err and str(bad) in err


def test_the_module_runs_as_a_command(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.compare", str(tmp_path / "missing"), str(tmp_path / "missing")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 4
    assert proc.stderr.strip().count("\n") == 0 and "no such file" in proc.stderr


def test_history_pictures_every_night_in_order(tmp_path: Path) -> None:
    nights = tmp_path / "nightly"
    for name, started, backward in (
        ("b", "2026-11-21T01:00:00+00:00", 92628),
        ("a", "2026-11-22T01:00:00+00:00", 99000),
    ):
        rep = baseline_report()
        rep["started"] = started
        find(rep, TIED, "memory")["metrics"]["measured"]["backward"] = backward
        (nights / name).mkdir(parents=True)
        (nights / name / "report.json").write_text(json.dumps(rep))
    (nights / "killed").mkdir()  # a run that never wrote report.json is left out
    runs = history.nights(nights)
    assert [n.label for n in runs] == ["b", "a"]  # by the report's start, not the folder's name
    assert history.series(runs, "backward peak")[TIED] == [92628, 99000]
    assert main(["--history", str(nights)]) == 0
    assert (nights / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["--history", str(tmp_path / "empty")]) == 4


def test_run_time_baseline_writes_compare_json_and_appends_to_summary(tmp_path: Path) -> None:
    """What --baseline adds at session end: the Reporter, fed the items of a run by hand."""
    old = baseline_report()
    (tmp_path / "old.json").write_text(json.dumps(old))
    session = SessionInfo("gloo", 2, "ci", False, ROOT / "xfails.toml", True)
    reporter = Reporter(tmp_path / "report", session, baseline=tmp_path / "old.json")
    new = [i for i in copy.deepcopy(old["cells"]) if "cell" in i]
    find({"cells": new}, TIED, "numerics")["outcome"] = "failed"
    for rec in new:
        reporter.records[rec["id"]] = rec
    reporter.pytest_sessionfinish(None, 1)  # type: ignore[arg-type]
    written = json.loads((tmp_path / "report" / "compare.json").read_text())
    assert written["regressions"] == 2
    assert {(c["kind"], c["cell"]) for c in written["items"]} == {
        ("newly failing", TIED),
        ("vanished", None),  # the generated model's item, not run here
    }
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert summary.startswith("# Thunder distributed conformance")
    assert f"## Runs compared\n\n- old: `{tmp_path / 'old.json'}`" in summary
    assert f"- `{TIED}` (numerics): passed → failed" in summary


def test_comparison_json_round_trips() -> None:
    comparison = compare(baseline_report(), baseline_report())
    assert json.loads(json.dumps(comparison.to_json()))["thresholds"]["memory: forward peak"].startswith("more than")


# Capability lost (issue 26): items of a real ci report, trimmed to four cells and the
# generated model's item (tests/unit/data/ci_report_excerpt.json; the collective sequences cut).
EXCERPT = Path(__file__).parent / "data" / "ci_report_excerpt.json"
NEOX = "litgpt_neox-meta_transformed_sd-fsdp_jit-tied-all-zero2-none-float32-torch_only-reshape-ws2"
DDP = "tied_lm-real_broadcast_first-ddp_jit-tied-min_bytes-zero2-none-float32-accumulate-ws2"
LLAMA = "litgpt_llama-real-ddp_jit-tied-largest_fraction-zero2-layer-float32-accumulate-ws2"
NVFUSER = "mlp-real-fsdp_jit-untied-none-zero2-none-float32-nvfuser-ws2"
NEOX_NUMERICS = f"conformance/test_numerics.py::test_numerics[{NEOX}]"
ENTRY = "xfails.toml:12: thunder.distributed.fsdp drops a tied weight's gradient (https://example.org/26)"
NO_EXECUTOR = "the executor 'nvfuser' is not registered in this Thunder"


def ci_report() -> dict[str, Any]:
    return json.loads(EXCERPT.read_text())


def degraded(rep: dict[str, Any]) -> dict[str, Any]:
    """``rep`` overnight on a fork that lost things: one passed item now xfailed under an entry,
    one unsupported (its skip as the report writes it), one cell gone."""
    new = copy.deepcopy(rep)
    xfailed = find(new, NEOX, "numerics")
    xfailed.update(outcome="xfailed", xfail_reason=ENTRY, message=f"{NEOX} does not conform (numerics)")
    unsupported = find(new, DDP, "memory")
    skip = ("conformance/frontend/verdict.py", 79, f"Skipped: unsupported: {NO_EXECUTOR}")
    unsupported.update(outcome="unsupported", message=str(skip))
    new["cells"] = [i for i in new["cells"] if i.get("cell") != LLAMA]
    return new


def compare_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: dict[str, Any], new: dict[str, Any], *extra: str
) -> tuple[int, str]:
    """Exit status and stdout of ``python -m conformance.compare OLD NEW`` (in process)."""
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    status = main([str(tmp_path / "old.json"), str(tmp_path / "new.json"), *extra])
    return status, capsys.readouterr().out


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


def suite_config(*args: str, keyword: str = "", markexpr: str = "", deselect: list[str] | None = None) -> Any:
    option = SimpleNamespace(keyword=keyword, markexpr=markexpr, deselect=deselect, lf=False)
    return SimpleNamespace(option=option, args=list(args), rootpath=ROOT, invocation_params=SimpleNamespace(dir=ROOT))


def test_a_run_selects_all_only_without_k_m_deselect_or_a_narrower_path() -> None:
    assert selects_all(suite_config("conformance"))
    assert selects_all(suite_config(str(ROOT / "conformance") + "/"))
    assert selects_all(suite_config(str(ROOT)))
    assert not selects_all(suite_config("conformance", keyword="tied_lm"))
    assert not selects_all(suite_config("conformance", markexpr="not slow"))
    assert not selects_all(suite_config("conformance", deselect=["conformance/test_memory.py"]))
    assert not selects_all(suite_config("conformance/test_memory.py"))
    assert not selects_all(suite_config(f"conformance/test_memory.py::test_memory[{DDP}]"))

"""python -m conformance.compare on two synthetic reports: regressions exit 1 and are named,
noise and identical runs exit 0, unreadable input exits 4 in one line; the history picture;
the run-time --baseline's comparison in the report folder. Capability lost, on a real ci
report, is test_capability_lost.py's. No world: the reports are built in report.json's schema."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.compare import main
from conformance.reports import history
from conformance.reports.comparison import compare
from conformance.reports.session import SessionInfo
from conformance.reports.writer import Reporter
from tests.support.report_data import MLP, TIED, baseline_report, find, item, run
from tests.support.suite_runs import ROOT


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

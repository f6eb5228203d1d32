"""The line between "Thunder does not conform" and "the kit broke": a fault planted in the
kit's own code (tests/support/kit_faults.py) is a pytest error (its own count, <error> in JUnit),
naming the kit's frame that raised, and hides no other area of the cell; an exception that
Thunder raises is Thunder's failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conformance.checks.registry import AREAS, applies
from conformance.matrix.cells import Cell
from tests.support.plant_plugin import KIT_FAULT_ENV
from tests.support.suite_runs import ROOT, SuiteRun, run_suite

pytestmark = pytest.mark.slow  # runs the suite in a subprocess

PLAIN = Cell("mlp", "real", "fsdp_jit")
CELL = PLAIN.id  # the smoke profile's plainest cell


def _run(tmp_path, fault: str) -> SuiteRun:
    return run_suite(tmp_path, "--profile", "smoke", "-k", CELL, env={KIT_FAULT_ENV: fault}, plant=True)


def _junit_kinds(run: SuiteRun) -> dict[str, str]:
    """test name -> "error", "failure" or "passed", as the JUnit XML says."""
    kinds = {}
    for case in run.junit.iter("testcase"):
        kind = next((child.tag for child in case if child.tag in ("error", "failure", "skipped")), "passed")
        kinds[case.get("name")] = kind
    return kinds


def test_a_crashing_check_errs_in_its_area_alone(tmp_path) -> None:
    run = _run(tmp_path, "memory_check_crashes")
    assert run.outcomes("memory") == {CELL: "error"}
    others = [name for name in AREAS if name != "memory" and applies(PLAIN, name)]
    for area in others:
        assert run.outcomes(area) == {CELL: "passed"}, area
    assert run.report["counts"] == {"passed": len(others), "error": 1}
    assert _junit_kinds(run)[f"test_memory[{CELL}]"] == "error"
    message = next(c["message"] for c in run.report["cells"] if c.get("area") == "memory")
    assert message.startswith(f"the kit broke, not Thunder: {CELL} (memory): rank 0: a check raised at ")
    assert "KeyError: 'a metric the check wrongly expects'" in message
    assert "1 error" in run.output and run.returncode == 1


def test_a_kit_assumption_about_thunders_api_errs_naming_its_frame(tmp_path) -> None:
    run = _run(tmp_path, "kit_assumes_missing_api")
    assert set(run.report["counts"]) == {"error"}
    assert set(_junit_kinds(run).values()) == {"error"}
    for record in run.report["cells"]:
        assert "the kit broke, not Thunder" in record["message"]
        # the kit's innermost frame on the traceback: where the assumption was made
        assert "at tests/support/kit_faults.py" not in record["message"]
        assert "the cell raised at " in record["message"]
        assert "TraceTag' has no attribute 'A_TAG_NO_THUNDER_HAS'" in record["message"]


def test_an_exception_raised_in_thunder_is_thunders_failure(tmp_path) -> None:
    run = _run(tmp_path, "thunder_raises")
    assert set(run.report["counts"]) == {"failed"}
    assert set(_junit_kinds(run).values()) == {"failure"}
    for record in run.report["cells"]:
        assert "the kit broke" not in record["message"]
        assert "planted: Thunder cannot shard this model" in record["message"]


def _ranks_of(report_dir) -> list[int]:
    """The rank processes still running whose world lives under ``report_dir``."""
    import psutil

    from conformance.world import protocol

    left = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(protocol.ENV_WORLD_DIR, "").startswith(str(report_dir)):
                left.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


@pytest.mark.parametrize(
    ("fault", "status"), [("probe_rank_killed_once", "died"), ("probe_rank_stopped_once", "stopped")]
)
def test_a_rank_lost_in_the_first_probe_is_survived_on_a_fresh_world(tmp_path, fault: str, status: str) -> None:
    run = _run(tmp_path, fault)
    assert run.returncode == 0, run.output
    assert set(run.report["counts"]) == {"passed"}, run.report["counts"]
    retried = [w for w in run.report["warnings"] if "did not complete at first and did on a fresh world" in w]
    assert len(retried) == 1 and f"rank 1: {status}" in retried[0]


def test_a_probe_that_fails_twice_ends_the_run_in_one_error_line(tmp_path) -> None:
    import time

    from conformance.frontend.probing import PROBE_FAILED

    # a process of its own, so that its worlds live under its report folder (a pooled world's do not)
    env = {KIT_FAULT_ENV: "probe_rank_killed_always"}
    run = run_suite(tmp_path, "--profile", "smoke", "-k", CELL, env=env, plant=True, shared=False)
    assert run.returncode == run.report["exit_status"] == PROBE_FAILED, run.output
    errors = [line for line in run.output.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and "did not complete, twice" in errors[0], run.output
    assert "INTERNALERROR" not in run.output and run.report["cells"] == []
    assert run.report["warnings"][-1].count("rank 1: died") == 2  # two worlds started, each lost rank 1
    deadline = time.monotonic() + 10
    while _ranks_of(run.report_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ranks_of(run.report_dir) == []


def test_a_controller_killed_while_writing_the_reports_leaves_whole_ones_and_no_rank(tmp_path) -> None:
    """SIGKILL between report.json and summary.md (plant_plugin's controller_killed_at_report):
    report.json is this run's and whole, summary.md not half written, no earlier run's report
    left to pass for this one's, and no rank process outlives the controller."""
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    (report_dir / "summary.md").write_text("an earlier run's summary")
    args = ["-p", "tests.support.plant_plugin", "-p", "no:cacheprovider", "-q", "--profile", "smoke", "-k", CELL]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance", *args, f"--report-dir={report_dir}"],
        cwd=ROOT,
        env={**os.environ, KIT_FAULT_ENV: "controller_killed_at_report"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    report = json.loads((report_dir / "report.json").read_text())
    assert {i["cell"] for i in report["cells"]} == {CELL} and report["counts"] == {"passed": len(report["cells"])}
    assert not (report_dir / "summary.md").exists() and not list(report_dir.glob(".*.partial"))
    deadline = time.monotonic() + 10
    while _ranks_of(report_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ranks_of(report_dir) == []

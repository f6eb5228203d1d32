"""The real suite through pytest, read back from every report it writes."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

from conformance.cells import AXES, matrix
from tests.suite import ROOT, SuiteRun, run_suite


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    return run_suite(tmp_path_factory.mktemp("e2e"))


def test_every_cell_conforms_on_the_pinned_thunder(suite: SuiteRun) -> None:
    assert suite.returncode == 0, suite.output
    cells = {c.id for c in matrix(2)}
    for area in ("numerics", "collectives"):
        assert suite.outcomes(area) == dict.fromkeys(cells, "passed")


def test_reports_agree_with_junit(suite: SuiteRun) -> None:
    cases = suite.junit.iter("testcase")
    junit = {}
    for case in cases:
        nodeid = f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}"
        junit[nodeid] = "failed" if case.find("failure") is not None or case.find("error") is not None else "passed"
    report = {c["id"]: c["outcome"] for c in suite.report["cells"]}
    streamed = {c["id"]: c["outcome"] for c in suite.jsonl}
    assert report == junit == streamed
    assert suite.report["counts"] == dict(collections.Counter(report.values()))


def test_junit_carries_each_cells_axes(suite: SuiteRun) -> None:
    for case in suite.junit.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert set(json.loads(props["axes"])) == set(AXES)


def test_report_records_environment_and_measurements(suite: SuiteRun) -> None:
    env = suite.report["environment"]
    assert env["backend"] == "gloo" and env["world_size"] == 2
    assert env["thunder"] and env["torch"]
    assert suite.report["worlds_started"] == 1, "one healthy world must serve every cell"
    for cell in suite.report["cells"]:
        assert set(cell["axes"]) == set(AXES)
        assert [r["rank"] for r in cell["ranks"]] == [0, 1]
        metrics = cell["metrics"]
        if cell["area"] == "numerics":
            assert metrics["gradients max_abs_err"] < 1e-4
        else:
            fwd = metrics["forward all_gathers"]
            assert fwd["expected"] == fwd["actual"] > 0


def test_summary_shows_every_cell(suite: SuiteRun) -> None:
    rows = [line for line in suite.summary.splitlines() if line.startswith("| ") and "✅" in line]
    assert len(rows) == len(list(matrix(2)))
    assert "24 passed" in suite.summary


def test_isolate_starts_a_world_per_cell(tmp_path) -> None:
    run = run_suite(tmp_path, "--isolate", "-k", "mlp and real")
    assert run.returncode == 0, run.output
    cells = {c["cell"] for c in run.report["cells"]}
    assert run.report["worlds_started"] == len(cells) == 2


def test_each_xdist_worker_owns_a_world(tmp_path) -> None:
    run = run_suite(tmp_path, "-n", "2", "--dist", "loadgroup", "-k", "tied_lm-real and not untied")
    assert run.returncode == 0, run.output
    assert len(run.report["cells"]) == 4
    assert run.report["worlds_started"] >= 1
    # loadgroup keeps both areas of a cell on one worker, so both read one run of it
    runs = collections.defaultdict(set)
    for item in run.report["cells"]:
        runs[item["cell"]].add(item["metrics"]["cell_run_s"])
    assert all(len(r) == 1 for r in runs.values()), runs


@pytest.mark.parametrize("bad", [["--backend", "bogus"], ["--nproc", "0"]])
def test_usage_error_exits_with_pytests_usage_status(bad: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "conformance", *bad], cwd=ROOT, capture_output=True)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR

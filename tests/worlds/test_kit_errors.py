"""The line between "Thunder does not conform" and "the kit broke": a fault planted in the
kit's own code (tests/support/kit_faults.py) is a pytest error (its own count, <error> in JUnit),
naming the kit's frame that raised, and hides no other area of the cell; an exception that
Thunder raises is Thunder's failure."""

from __future__ import annotations

import pytest

from conformance.checks.registry import AREAS, applies
from conformance.matrix.cells import Cell
from tests.support.plant_plugin import KIT_FAULT_ENV
from tests.support.suite_runs import SuiteRun, run_suite

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

"""-x stops right after the first cell with a failing area: items run cell by cell, so a bug
only a late area (memory, here) sees is reported after its cell, not after every cell's
earlier areas (conformance/frontend/plugin.py: pytest_collection_modifyitems)."""

from __future__ import annotations

import datetime
import time

import pytest

from conformance.world.controller import CLOSE_TIMEOUT_S
from tests.support.plant_plugin import ENV
from tests.support.suite_runs import run_suite

pytestmark = pytest.mark.slow  # runs the suite

BUG = "originals_kept"  # memory alone sees it, on the cells of real init


def test_x_stops_after_the_first_failing_cell(tmp_path) -> None:
    run = run_suite(tmp_path, "--profile", "smoke", "-k", "not generated", "-x", env={ENV: BUG}, plant=True)
    # from the run's start (its report's clock) to its very end: reports written, worlds closed
    elapsed = time.time() - datetime.datetime.fromisoformat(run.report["started"]).timestamp()
    assert run.returncode == 1, run.output
    ran = [item for item in run.jsonl if item.get("cell")]  # in the order they ran
    assert ran, run.output
    failed = [i for i, item in enumerate(ran) if item["outcome"] == "failed"]
    assert failed == [len(ran) - 1], f"-x went on after the first failure: {[i['id'] for i in ran]}"
    assert ran[-1]["area"] == "memory", ran[-1]["id"]
    # every cell's items in one block: a cell that ended never comes back
    blocks = [item["cell"] for k, item in enumerate(ran) if k == 0 or item["cell"] != ran[k - 1]["cell"]]
    assert len(blocks) == len(set(blocks)), blocks
    # the run ends within 1.5x the moment its first failure was known (issue 28's bound), or,
    # where the failure came that early, within the session's end: reports written and worlds
    # closed, each world given CLOSE_TIMEOUT_S to exit
    first_failure = ran[failed[0]]["ended_s"]
    assert elapsed <= max(1.5 * first_failure, first_failure + CLOSE_TIMEOUT_S), (elapsed, first_failure)

"""A rank lost at any phase of a cell (killed, or stopped past the cell timeout): that cell's
items fail naming the rank and the phase it was in, every other cell is judged as in a clean
run, the reports are whole, and no rank process outlives the run.

One suite run holds the whole matrix: each of the cheapest real cells of ci loses rank 1 at
another phase (killed at every one, stopped at every one: see PHASES;
tests/support/kit_faults.py: rank_lost), and the cheapest is left clean."""

from __future__ import annotations

import json
import time

import pytest

from conformance.frontend import chaos
from conformance.matrix.cost import expected_seconds
from conformance.matrix.profiles import cells
from tests.support.kit_faults import LOST_AT_ENV
from tests.support.plant_plugin import KIT_FAULT_ENV
from tests.support.suite_runs import probed_on_this_machine, run_suite, runs_to_the_end
from tests.worlds.test_kit_errors import _ranks_of

pytestmark = pytest.mark.slow  # runs the suite in a subprocess

# (a phase's name or part of it, as conformance/rank/progress.py writes it; how rank 1 is lost):
# killed, and stopped (its peers block in a collective, in setup or a step, or have finished)
PHASES = [(phase, how) for how in ("kill", "stop") for phase in chaos.PHASES]
# a stopped rank is given up after the controller's STOP_GRACE_S; were it not, its cell would
# end here, and fail the test (a clean cheap cell takes a few seconds)
CELL_TIMEOUT = 40


def test_a_rank_lost_at_each_phase_fails_that_cell_alone_naming_rank_and_phase(tmp_path) -> None:
    probed = probed_on_this_machine()
    # cells that reach every phase (offered, not negative, not ending at an expected raise)
    real = [c for c in cells("ci", 2, probed) if not c.simulated and c.world_size == 2 and runs_to_the_end(c, probed)]
    cheapest = sorted(real, key=expected_seconds)[: len(PHASES) + 1]
    clean, faulted = cheapest[0], cheapest[1:]
    lost_at = {c.id: list(p) for c, p in zip(faulted, PHASES, strict=True)}
    env = {KIT_FAULT_ENV: "rank_lost", LOST_AT_ENV: json.dumps(lost_at)}
    selection = " or ".join(c.id for c in cheapest)
    # a process of its own, so that its worlds live under its report folder (a pooled world's do not)
    run = run_suite(
        tmp_path,
        "--profile",
        "ci",
        "-k",
        selection,
        "--cell-timeout",
        str(CELL_TIMEOUT),
        env=env,
        plant=True,
        shared=False,
    )
    assert run.returncode == 1, run.output
    by_cell: dict[str, list[dict]] = {}
    for item in run.report["cells"]:
        by_cell.setdefault(item["cell"], []).append(item)
    assert set(by_cell) == {c.id for c in cheapest}
    assert {i["outcome"] for i in by_cell[clean.id]} <= {"passed", "xfailed"}, by_cell[clean.id]
    for cell in faulted:
        phase, how = lost_at[cell.id]
        status = "died" if how == "kill" else "stopped"
        for item in by_cell[cell.id]:
            assert item["outcome"] == "failed", (cell.id, phase, item)
            head = item["message"].splitlines()[0]
            assert "the kit broke" not in item["message"]
            # the lost rank is the first culprit: the first line says where it was
            assert f"did not run to completion: rank 1 {status} during " in head and phase in head, head
            assert phase in next(r for r in item["ranks"] if r["rank"] == 1)["phase"]
            assert any(
                line.startswith(f"--- rank 1: {status} after ") and phase in line
                for line in item["message"].splitlines()
            ), item["message"]
    # the reports are whole: every item in report.json and report.jsonl, each line JSON
    lines = [json.loads(line) for line in (run.report_dir / "report.jsonl").read_text().splitlines()]
    assert len(lines) >= len(run.report["cells"])
    deadline = time.monotonic() + 10
    while _ranks_of(run.report_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ranks_of(run.report_dir) == []

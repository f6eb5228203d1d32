"""Every check is shown to fail: a bug planted in Thunder inside the ranks (the records of
tests/planted/) makes the suite fail on exactly the cells and check areas it should, saying why.

The suite runs its smoke profile here (one cell per kind of check), or, for a bug that only
a path the smoke cells do not take can show (bfloat16, ZERO3, bucketing, world sizes above
2), the ci profile's cells that take it beside some that do not. Expectations are predicates
over cells, so they hold for any profile.
"""

from __future__ import annotations

import shlex

import pytest

from conformance.matrix.cells import Cell
from fixtures.compositions import COMPOSITIONS
from tests.planted.cells import NONE
from tests.planted.record import Expect, PlantedBug
from tests.planted.registry import BUGS, RECORDS
from tests.support.plant_plugin import ENV
from tests.support.suite_runs import ends_at_expected_raise, offered, probed_on_this_machine, run_suite

pytestmark = pytest.mark.slow  # starts worlds or runs the suite in a subprocess

UNNAMED = Expect(NONE, NONE, "")  # an area the record does not name must pass everywhere
# A record is judged on what its cells show, never on their time: twice the suite's 300 s per
# cell, and the whole run's bound with it. A litgpt cell at a second input shape takes ~250 s
# on CI's two cores, and one beside the kit's other tests on a loaded machine timed out in its
# checks (ddp_second_shape_sums_with_shared_weight, 2026-11-29).
CELL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 1800


def _selection(bug: PlantedBug) -> list[str]:
    """The suite's arguments for the cells ``bug`` runs on."""
    if bug.cells is None:
        return ["--profile", "smoke", "-k", "not generated"]
    from conformance.matrix.cost import expected_seconds
    from conformance.matrix.profiles import cells

    # on the pin, the probed compositions and executors are the unsupported ones; of each kind
    # wanted the cheapest cell (by its model's tracing and its scenario's compilations: the
    # records are most of the kit's slow tests' time, and a planted bug shows on any cell of its
    # kind), from ci, else nightly (a pairwise array need not hold every triple: root_owned's
    # resume may be DDP's alone)
    probed = probed_on_this_machine()
    # a cell the pin's raises entries expect to raise ends there: no planted bug can show in it,
    # unless the bug is about that raise (``PlantedBug.at_raises``)
    offers = {}
    for profile in ("ci", "nightly"):
        running = [
            c
            for c in cells(profile, 2, probed)
            if offered(c, probed)
            and COMPOSITIONS[c.composition].parallelism in bug.parallelisms
            and (bug.at_raises or not ends_at_expected_raise(c))
        ]
        running.sort(key=expected_seconds)
        chosen = [next((c for c in running if wanted(c)), None) for wanted in bug.cells]
        if all(chosen):
            offers[profile] = chosen
    if not offers:
        raise AssertionError(f"no profile holds a cell of each kind {bug.name} is tried on")
    # ci wherever it holds every kind: its cells are the ones CI's own run just ran clean, where
    # a nightly cell may fail on the pin for reasons of its own (as root_owned's bfloat16 ZERO3
    # forward peak did, 60 B over its bound, until the bound took e_f: docs/measurements.md)
    profile = "ci" if "ci" in offers else "nightly"
    return ["--profile", profile, "-k", " or ".join(c.id for c in offers[profile])]


# bugs that only simulated worlds show (no areas on real worlds) have tests/planted/test_scale.py
@pytest.mark.parametrize("bug", [b.name for b in RECORDS if b.areas])
def test_planted_bug_is_caught(bug: str, tmp_path) -> None:
    record = BUGS[bug]
    # generated models have a planted test of their own (tests/planted/test_generated.py)
    selection = [*_selection(record), "--cell-timeout", str(CELL_TIMEOUT_S)]
    run = run_suite(tmp_path, *selection, env={ENV: bug}, plant=True, timeout=RUN_TIMEOUT_S)
    assert run.returncode == 1, run.output
    caught = 0
    for item in run.report["cells"]:
        if item["outcome"] == "unsupported":
            continue
        cell = Cell(**item["axes"])
        expect = record.areas.get(item["area"], UNNAMED)
        if expect.must(cell):
            assert item["outcome"] == "failed", f"{bug} not caught by {item['area']} on {cell.id}"
            assert any(w in item["message"] for w in expect.words.split(" | ")), item["message"]
            caught += 1
        elif not expect.may(cell):
            # a known non-conformance of the pin (xfails file) stays what it was
            assert item["outcome"] in ("passed", "xfailed"), (
                f"{bug} blamed on {item['area']} of {cell.id}:\n{item.get('message')}"
            )
        if item["outcome"] == "failed":
            assert f"repro: python -m pytest {shlex.quote(item['id'])} --nproc 2" in item["message"]
    assert caught, f"no cell selected where {bug} must be caught"

"""--chaos's plan and its judgement of a faulted cell, without a world: the plan is the seed's
alone, and a faulted cell counts as lost as planned only where the lost process is blamed
first, in the planned phase, by the item's own first line. The suite run that loses ranks
for real is tests/worlds/test_end_to_end.py::test_chaos_faults_only_its_cells."""

from __future__ import annotations

import math

import pytest

from conformance.frontend.chaos import PHASES, Chaos, Fault, judged
from conformance.matrix.profiles import cells
from conformance.matrix.simulated import world_of
from conformance.reports.comparison import CAPABILITY_LOST, FAULTED, compare
from conformance.reports.outcomes import CHAOS_LOST, CHAOS_MISREPORTED, CHAOS_NOT_REACHED
from conformance.world import protocol
from conformance.world.outcome import Outcome

NIGHTLY = cells("nightly", 2, {})


def test_the_plan_is_the_seeds_alone() -> None:
    first = {c.id: Chaos(7).fault(c) for c in NIGHTLY}
    assert first == {c.id: Chaos(7).fault(c) for c in NIGHTLY}
    assert first != {c.id: Chaos(8).fault(c) for c in NIGHTLY}
    assert all(Chaos(7, share=1.0).fault(c) is not None for c in NIGHTLY)


@pytest.mark.parametrize("share", [0.05, 0.1, 0.5])
def test_a_share_of_the_cells_is_faulted_at_a_phase_a_cell_has(share: float) -> None:
    faults = {c: f for c in NIGHTLY if (f := Chaos(2026, share).fault(c)) is not None}
    n = len(NIGHTLY)
    # a binomial count: within five standard deviations of n * share
    assert abs(len(faults) - n * share) <= 5 * math.sqrt(n * share * (1 - share)), (len(faults), n)
    assert all(f.phase in PHASES and 0 <= f.process < world_of(c)[0] for c, f in faults.items())
    assert {f.phase for f in faults.values()} == set(PHASES) or share < 0.1
    assert {f.how for f in faults.values()} == {"kill", "stop"}  # killed, or stopped


def _outcome(*results: protocol.RankResult) -> Outcome:
    return Outcome(list(results), duration=1.0, startup=0.0)


KILLED = Fault(process=1, phase="backward")
DEAD = protocol.RankResult(1, protocol.DIED, phase="training / step 0 (SGD) / backward")
WAITED = protocol.RankResult(0, protocol.FAILED, error="Connection closed by peer")
SAID = "cell c did not run to completion: rank 1 died during training / step 0 (SGD) / backward"


def test_a_death_blamed_first_in_its_phase_is_lost_as_planned() -> None:
    assert judged(KILLED, _outcome(WAITED, DEAD), failed=True, message=SAID + "\n...") == CHAOS_LOST


def test_a_cell_whose_rank_never_entered_the_phase_is_not_reached() -> None:
    clean = _outcome(protocol.RankResult(0, protocol.PASSED), protocol.RankResult(1, protocol.PASSED))
    assert judged(KILLED, clean, failed=False, message="") == CHAOS_NOT_REACHED
    # Thunder raised before the phase (an expected failure): the planned process never died
    raised = _outcome(protocol.RankResult(0, protocol.FAILED), protocol.RankResult(1, protocol.FAILED))
    assert (
        judged(KILLED, raised, failed=True, message="cell c did not run to completion: Thunder raised")
        == CHAOS_NOT_REACHED
    )


@pytest.mark.parametrize(
    "message",
    [
        "the kit broke, not Thunder: c (numerics): rank 0: the cell raised",  # blamed itself
        "cell c did not run to completion: Thunder raised at torchex.py:1",  # blamed Thunder
        "cell c did not run to completion: rank 1 died during training / step 0 (SGD) / forward",  # wrong phase
    ],
)
def test_a_death_the_item_tells_otherwise_is_misreported(message: str) -> None:
    assert judged(KILLED, _outcome(WAITED, DEAD), failed=True, message=message) == CHAOS_MISREPORTED


def test_a_stop_counts_only_where_the_process_was_found_stopped() -> None:
    stopped = Fault(process=0, phase="forward", how="stop")
    forward = "training / step 0 (SGD) / forward"
    waited = protocol.RankResult(1, protocol.ABORTED, phase=forward)
    found = protocol.RankResult(0, protocol.STOPPED, phase=forward, stopped=True)
    said = f"cell c did not run to completion: rank 0 stopped during {forward}"
    assert judged(stopped, _outcome(found, waited), failed=True, message=said) == CHAOS_LOST
    # stopped within the grace of the cell timeout: found stopped at the timeout
    hung = protocol.RankResult(0, protocol.TIMEOUT, phase=forward, stopped=True)
    said = f"cell c did not run to completion: rank 0 timeout during {forward}"
    assert judged(stopped, _outcome(hung, waited), failed=True, message=said) == CHAOS_LOST
    running = protocol.RankResult(0, protocol.TIMEOUT, phase=forward)
    assert judged(stopped, _outcome(running, waited), failed=True, message=said) == CHAOS_NOT_REACHED


def test_the_armed_task_runs_the_cells_own() -> None:
    task = protocol.Task("conformance.rank.entry:run_cell", {"axes": {}, "declared": []})
    armed = KILLED.task(task)
    assert armed.kwargs == {"fn": task.fn, "kwargs": task.kwargs, "process": 1, "phase": "backward", "how": "kill"}
    assert protocol.Task.decode(armed.encode()) == armed


def test_a_comparison_with_a_clean_run_sets_the_faulted_items_apart() -> None:
    def item(n: int, outcome: str, **extra: object) -> dict[str, object]:
        return {"id": f"t[c{n}]", "cell": f"c{n}", "area": "numerics", "outcome": outcome, **extra}

    lost = {"verdict": CHAOS_LOST, "fault": "rank 1 killed entering 'backward'"}
    clean = {"cells": [item(0, "passed"), item(1, "passed"), item(2, "passed")]}
    chaos = {"cells": [item(0, "xfailed", chaos=lost), item(1, "passed"), item(2, "xfailed")]}
    comparison = compare(clean, chaos)
    kinds = {c.item: c.kind for c in comparison.items}
    assert kinds == {"t[c0]": FAULTED, "t[c2]": CAPABILITY_LOST}
    assert [c.item for c in comparison.capability_lost] == ["t[c2]"] and comparison.regressions == 1

"""The three-way planted bugs (tests/planted/three_way.py) need ci's coverage contract: ci's
cells hold a cell each of them must fail on, which ci's pairwise array alone (the generator
without its top-up, recomputed here) holds only by chance, and each is caught on exactly
those cells (tests/planted/test_planted_bugs.py runs them). No world is started here."""

from __future__ import annotations

import pytest

from conformance.matrix.cells import Cell
from conformance.matrix.contract import items_of
from conformance.matrix.profiles import cells
from tests.planted.registry import RECORDS

# what the worlds' probe refuses on the pin on a CPU (tests/unit/test_profiles.py holds it)
PIN_UNSUPPORTED = dict.fromkeys(("legacy_jit_fsdp", "nvfuser"), "")
THREE_WAY = [b for b in RECORDS if b.family == "three_way"]


def _running(contract: bool) -> list[Cell]:
    selected = cells("ci", 2, PIN_UNSUPPORTED, contract=contract)
    return [c for c in selected if not c.simulated and c.composition not in PIN_UNSUPPORTED]


CI = _running(contract=True)
PAIRWISE = _running(contract=False)


def _must_fail(bug_name: str, among: list[Cell]) -> list[Cell]:
    bug = next(b for b in THREE_WAY if b.name == bug_name)
    return [c for c in among if any(e.must(c) for e in bug.areas.values())]


def test_three_way_bugs_of_different_features_and_both_families() -> None:
    assert len(THREE_WAY) >= 3
    # each must-fail cell meets one (feature, family, scenario) of the contract; the bugs'
    # features differ and both families are among them
    met = []
    for bug in THREE_WAY:
        found = {frozenset(i) for c in _must_fail(bug.name, CI) for i in items_of(c.__dict__) if len(i) == 3}
        assert found, bug.name
        met.append(found)
    families = {dict(i)["family"] for found in met for i in found}
    assert families == {"fsdp", "ddp"}


@pytest.mark.parametrize("bug", [b.name for b in THREE_WAY])
def test_ci_holds_a_failing_cell_for_each(bug: str) -> None:
    assert _must_fail(bug, CI), f"ci holds no cell {bug} must fail on"
    # the slow test picks ci's cells for it (not nightly's): one for each of its predicates
    record = next(b for b in THREE_WAY if b.name == bug)
    assert all(any(p(c) for c in CI) for p in record.cells or ())


def test_the_pairwise_array_alone_leaves_contract_triples_unmet() -> None:
    """What the coverage contract adds: the pairwise array meets a (feature, family, scenario)
    triple only by chance (which ones changes whenever an axis or a model's features change:
    it missed a three-way record's triple until root_owned's frozen gain, 2026-11-30), the
    contract's top-up always."""
    from conformance.matrix.contract import unmet_contract

    assert unmet_contract(PAIRWISE, 2, PIN_UNSUPPORTED, nightly=None)
    assert unmet_contract(CI, 2, PIN_UNSUPPORTED, nightly=None) == []

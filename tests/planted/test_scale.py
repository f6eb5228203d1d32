"""Bugs that only sharding at scale shows (the records with ``at_scale``), planted in simulated
worlds (conformance/rank/simulate.py): from the model's shapes and the world size alone the
test predicts which cells and which sampled ranks must fail."""

from __future__ import annotations

import pytest
import torch

from conformance.checks.storages import distinct_storages
from conformance.matrix import simulated
from conformance.matrix.cells import Cell
from conformance.matrix.profiles import cells
from fixtures.models import fixture_for
from fixtures.patterns import held_rows
from tests.planted.registry import RECORDS
from tests.planted.sharding import STRING_ORDER, shows_string_order
from tests.support.permutations import decimal_order
from tests.support.plant_plugin import ENV
from tests.support.suite_runs import run_suite


def _shapes(cell: Cell) -> list[tuple[int, ...]]:
    with torch.device("meta"):
        module = fixture_for(cell.model).build(cell.tie == "tied")
    return [tuple(p.shape) for p in distinct_storages(module).values()]


def _holds_rows(cell: Cell, rank: int) -> bool:
    return any(len(held_rows(shape[0], cell.world_size, rank)) for shape in _shapes(cell))


def _divisible(cell: Cell) -> bool:
    return any(shape[0] % cell.world_size == 0 for shape in _shapes(cell))


def _pythia_at(world_size: int) -> Cell:
    """The scale profile's first pythia cell at ``world_size``, without bucketing if it has one."""
    candidates = [c for c in cells("scale", 2, {"legacy_jit_fsdp": "probed"}) if c.model == "pythia_160m"]
    at = [c for c in candidates if c.world_size == world_size]
    return sorted(at, key=lambda c: c.bucketing != "none")[0]


# pythia at 1000 ranks: no first dimension divides (768, 2304, 3072, 50304) and the last rank
# holds padding only (51-row vocabulary shards end at rank 986); at 1024, 3072 MLP rows make
# three-row shards on every rank
CELLS = (_pythia_at(1000), _pythia_at(1024))
# the cells each bug runs on: both where which one fails is the prediction, else the one at
# 1000 ranks, whose ranks past 986 hold padding only (each such cell compiles pythia: ~40 s);
# a slot permutation on ci's own simulated cells, as ci runs them (module init shows it; a
# transformed state dict's shards are the kit's)
RUNS_ON = {"padding_when_divisible": CELLS, **dict.fromkeys(STRING_ORDER, simulated.CI)}


def _moved_ranks(cell: Cell) -> set[int]:
    """The sampled ranks whose rows differ from those of their string-order slot."""
    n, slot_of = cell.world_size, decimal_order(cell.world_size)
    shapes = _shapes(cell)
    return {
        r
        for r in simulated.sampled_ranks(n)
        if any(held_rows(s[0], n, r) != held_rows(s[0], n, slot_of[r]) for s in shapes)
    }


def _failed_ranks(item: dict) -> set[int]:
    return {r["rank"] for r in item["ranks"] if r.get("failures")}


@pytest.mark.slow
@pytest.mark.parametrize("bug", [b.name for b in RECORDS if b.at_scale])
def test_a_bug_only_scale_shows_fails_where_predicted(bug: str, tmp_path) -> None:
    runs_on = RUNS_ON.get(bug, CELLS[:1])
    selected = " or ".join(c.id for c in runs_on)
    profile = "ci" if runs_on == simulated.CI else "scale"
    run = run_suite(tmp_path, "--profile", profile, "-k", selected, env={ENV: bug}, plant=True)
    items = {(item["cell"], item["area"]): item for item in run.report["cells"]}
    assert {cell for cell, _ in items} == {c.id for c in runs_on}, run.output
    for cell in runs_on:
        outcomes = {area: items[cell.id, area]["outcome"] for area in ("collectives", "memory", "sharding")}
        known = {"passed", "xfailed"}  # the pin's known non-conformances stay what they were
        if bug == "padding_when_divisible":
            # a chunk one row too long where the world size divides a first dimension, and only there
            if _divisible(cell):
                assert outcomes["sharding"] == "failed", outcomes
                assert (
                    "shape" in items[cell.id, "sharding"]["message"]
                    or "did not run" in items[cell.id, "sharding"]["message"]
                )
            else:
                assert set(outcomes.values()) <= known, outcomes
        elif bug in STRING_ORDER:
            assert outcomes["collectives"] in known and outcomes["memory"] in known, outcomes
            if shows_string_order(cell):
                moved = _moved_ranks(cell)
                assert moved and outcomes["sharding"] == "failed", outcomes
                assert _failed_ranks(items[cell.id, "sharding"]) == moved
                assert "expected rows" in items[cell.id, "sharding"]["message"]
            else:
                assert outcomes["sharding"] in known, outcomes
        elif bug == "offset_off_past_first_rank":
            wrong = {r for r in simulated.sampled_ranks(cell.world_size) if r > 0 and _holds_rows(cell, r)}
            assert wrong and outcomes["sharding"] == "failed"
            assert _failed_ranks(items[cell.id, "sharding"]) == wrong
            assert "expected rows" in items[cell.id, "sharding"]["message"]
            assert outcomes["collectives"] in known and outcomes["memory"] in known, outcomes
        else:
            odd = sorted(r for r in simulated.sampled_ranks(cell.world_size) if r % 2)
            assert outcomes["collectives"] == "failed"
            assert f"ranks {odd}: collective sequence differs from rank 0's" in items[cell.id, "collectives"]["message"]
            assert outcomes["memory"] in known and outcomes["sharding"] in known, outcomes

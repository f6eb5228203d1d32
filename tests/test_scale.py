"""Simulated worlds (conformance/rank/simulate.py): cells of 7 to 1024 ranks acted out by four
sampled ranks under torch's fake process group.

Fast tests hold the arithmetic, the ids and the profile; slow ones plant bugs that only
sharding at scale shows and predict, from the model's shapes and the world size alone, which
cells and which sampled ranks must fail.
"""

from __future__ import annotations

import json

import pytest
import torch

from conformance.checks.sharding import held_rows
from conformance.checks.storages import distinct_storages
from conformance.matrix import simulated
from conformance.matrix.cells import Cell
from conformance.matrix.profiles import cell_from_axes, cells
from fixtures import patterns
from fixtures.models import fixture_for
from tests.plant_plugin import ENV
from tests.suite_runs import run_suite

SIM = Cell("pythia_160m", "meta_module_init", "jit_fsdp", tie="tied", world_size=1024, simulated=True)


def test_a_simulated_cell_says_so_in_its_id_and_replays() -> None:
    assert SIM.id.endswith("-ws1024sim")
    assert cell_from_axes(json.loads(json.dumps(SIM.axes()))) == SIM
    assert "simulated" not in Cell("mlp", "real", "fsdp_jit").axes()  # real cells' ids and axes unchanged


@pytest.mark.parametrize(
    "change, words",
    [
        ({"world_size": 3}, "at least 4 ranks"),
        ({"model": "mlp"}, "model 'mlp' is not one of"),
        ({"init": "meta_original_sd"}, "init 'meta_original_sd' is not one of"),
        ({"dtype": "bfloat16"}, "dtype 'bfloat16' is not one of"),
        ({"model": "llama2_7b_width"}, "a tie the model does not offer"),
        ({"simulated": "yes"}, "simulated must be true or false"),
    ],
)
def test_a_cell_that_cannot_be_simulated_is_refused_in_one_line(change: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        cell_from_axes({**SIM.axes(), **change})


def test_sampled_ranks_are_the_first_two_a_middle_one_and_the_last() -> None:
    assert simulated.sampled_ranks(1024) == (0, 1, 512, 1023)
    assert simulated.sampled_ranks(7) == (0, 1, 3, 6)
    assert all(len(set(simulated.sampled_ranks(n))) == simulated.SAMPLED for n in simulated.WORLD_SIZES)


@pytest.mark.parametrize(
    "dim0, world, rank, rows",
    [
        (768, 1024, 767, (767, 768)),
        (768, 1024, 1023, (768, 768)),
        (3072, 1024, 1023, (3069, 3072)),
        (50304, 1000, 999, (50304, 50304)),
        (50304, 1000, 986, (50286, 50304)),
        (10, 4, 3, (9, 10)),
    ],
)
def test_held_rows_pad_dim0_up_to_a_multiple_of_the_world(dim0: int, world: int, rank: int, rows: tuple) -> None:
    assert (held_rows(dim0, world, rank).start, held_rows(dim0, world, rank).stop) == rows


def test_a_pattern_shard_holds_its_rows_and_zero_padding() -> None:
    piece = patterns.shard((10, 3), rank=3, world_size=4, dtype=torch.float32)
    assert piece.shape == (3, 3) and piece[:, 0].tolist() == [9.0, 0.0, 0.0]


def test_the_scale_profile_is_simulated_pairwise_and_ci_holds_a_few() -> None:
    scale = cells("scale", 2, {"legacy_jit_fsdp": "probed"})
    assert scale and all(c.simulated and simulated.why_not(c) is None for c in scale)
    assert {c.world_size for c in scale} == set(simulated.WORLD_SIZES)
    ci = [c for c in cells("ci", 2, {}) if c.simulated]
    assert ci == list(simulated.CI)


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


def _failed_ranks(item: dict) -> set[int]:
    return {r["rank"] for r in item["ranks"] if r.get("failures")}


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["padding_when_divisible", "offset_off_past_first_rank", "collective_order_by_rank"])
def test_a_bug_only_scale_shows_fails_where_predicted(bug: str, tmp_path) -> None:
    run = run_suite(tmp_path, "--profile", "scale", "-k", " or ".join(c.id for c in CELLS), env={ENV: bug}, plant=True)
    items = {(item["cell"], item["area"]): item for item in run.report["cells"]}
    assert {cell for cell, _ in items} == {c.id for c in CELLS}, run.output
    for cell in CELLS:
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

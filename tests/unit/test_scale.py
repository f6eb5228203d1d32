"""Simulated worlds (conformance/rank/simulate.py): cells of 7 to 1024 ranks acted out by five
sampled ranks under torch's fake process group.

These tests hold the arithmetic, the ids and the profile, without a world;
tests/planted/test_scale.py plants bugs that only sharding at scale shows and predicts, from
the model's shapes and the world size alone, which cells and which sampled ranks must fail.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

from conformance.matrix import simulated
from conformance.matrix.axes import cell_from_axes
from conformance.matrix.cells import Cell
from conformance.matrix.profiles import cells
from fixtures import patterns
from fixtures.patterns import held_rows
from tests.support import permutations

SIM = Cell("pythia_160m", "meta_module_init", "jit_fsdp", tie="tied", world_size=1024, simulated=True)


def test_a_simulated_cell_says_so_in_its_id_and_replays() -> None:
    assert SIM.id.endswith("-ws1024sim")
    assert cell_from_axes(json.loads(json.dumps(SIM.axes()))) == SIM
    assert "simulated" not in Cell("mlp", "real", "fsdp_jit").axes()  # real cells' ids and axes unchanged


@pytest.mark.parametrize(
    "change, words",
    [
        ({"world_size": 3}, "at least 5 ranks"),
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


def test_sampled_ranks_are_the_ends_2_10_and_a_prime_near_a_third() -> None:
    assert simulated.sampled_ranks(1000) == (0, 2, 10, 337, 999)
    assert simulated.sampled_ranks(1024) == (0, 2, 10, 347, 1023)
    assert simulated.sampled_ranks(7) == (0, 1, 2, 3, 6)  # a small world fills up from 1
    assert all(len(set(simulated.sampled_ranks(n))) == simulated.SAMPLED for n in range(simulated.SAMPLED, 2049))


def test_every_plausible_slot_permutation_moves_a_sampled_rank() -> None:
    """A rank handed another slot's shard shows only where a sampled rank is moved: every
    permutation of the family (tests/support/permutations.py) that is not the identity moves
    one at every size to 256 and around 1000 and 2048 (every size to 2048 was checked once),
    and two at the simulated sizes from 64 on, so that one moved rank holding only padding
    cannot hide it. (The earlier sample, 0, 1, N // 2, N - 1, was moved by one rank alone
    under decimal string order at 1000 and binary at 1024.)"""
    for n in sorted({*range(simulated.SAMPLED, 257), *simulated.WORLD_SIZES, 997, 999, 1001, 2047, 2048}):
        ranks = simulated.sampled_ranks(n)
        for name, slot_of in permutations.family(n):
            moved = [r for r in ranks if slot_of[r] != r]
            if slot_of != list(range(n)):
                assert len(moved) >= (2 if n in simulated.WORLD_SIZES and n >= 64 else 1), (n, name, ranks)


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
    # both ways a simulated world is initialized: Thunder cutting the shards (module init) and
    # Thunder loading the kit's; each at a size that leaves its last ranks empty
    assert {c.init for c in ci} == set(simulated.INITS)
    assert all(not held_rows(768, c.world_size, c.world_size - 1) for c in ci)


class _Holds:
    """A stand-in Thunder module holding given shards."""

    def __init__(self, shards: dict[str, torch.Tensor]) -> None:
        self.shards = shards

    def get_parameter(self, name: str) -> torch.Tensor:
        if name not in self.shards:
            raise AttributeError(name)
        return self.shards[name]

    def parameters(self) -> Iterator[torch.Tensor]:
        return iter(self.shards.values())


def _sharding_failures(shards: dict[str, torch.Tensor], rank: int, world: int = 4) -> list[str]:
    from conformance.checks import sharding
    from conformance.checks.record import SimulatedMemory, SimulatedRecord

    with torch.device("meta"):
        eager_model = torch.nn.Linear(3, 10)  # weight 10 x 3, bias 10: chunks of 3 rows at 4 ranks
    cell = Cell("pythia_160m", "meta_module_init", "jit_fsdp", world_size=world, simulated=True)
    run = SimulatedRecord(cell, rank, eager_model, _Holds(shards), SimulatedMemory(0, 0, 0), {})
    return sharding.check(run).failures


def _right(rank: int) -> dict[str, torch.Tensor]:
    return {
        "weight": patterns.shard((10, 3), rank, 4, torch.float32),
        "bias": patterns.shard((10,), rank, 4, torch.float32),
    }


@pytest.mark.parametrize("rank", range(4))
def test_sharding_passes_the_right_shards_of_every_rank(rank: int) -> None:
    assert _sharding_failures(_right(rank), rank) == []


def test_sharding_names_a_shard_one_row_off_a_wrong_shape_nan_and_a_missing_one() -> None:
    # rank 3 holds row 9 and two of padding; cut one row early, it holds rows 8 and 9
    early = torch.cat([patterns.rows(8, 2, (10, 3), torch.float32), torch.zeros(1, 3)])
    off = {**_right(3), "weight": early}
    assert _sharding_failures(off, 3) == ["shard [weight]: holds row 8 in its first 1 rows, expected rows 9..9"]
    short = {**_right(1), "bias": patterns.shard((10,), 1, 4, torch.float32)[:2]}
    assert _sharding_failures(short, 1)[0].startswith("shard [bias]: shape (2,), expected (3,) (dim 0 of 10 padded")
    assert "shard bytes: expected" in _sharding_failures(short, 1)[-1]
    nan = {**_right(1), "weight": torch.full((3, 3), float("nan"))}
    assert _sharding_failures(nan, 1) == [
        "shard [weight]: holds values that are no rows of the parameter in its first 3 rows, expected rows 3..5"
    ]
    assert (
        _sharding_failures({"weight": _right(0)["weight"]}, 0)[0]
        == "shard [bias]: the Thunder module has no such parameter"
    )


def test_ranks_whose_collective_sequence_differs_are_named_with_the_first_difference() -> None:
    from conformance.checks.collectives import AREA, SEQUENCE, sequences_differ
    from conformance.checks.findings import Findings

    def answer(seq: list[str]) -> Findings:
        return Findings(metrics={SEQUENCE: seq})

    same = ["forward all_gather float32 40 B", "forward all_gather float32 12 B"]
    swapped = list(reversed(same))
    results = [answer(same), answer(swapped), answer(same), answer([*swapped, "backward reduce_scatter float32 4 B"])]
    differing = sequences_differ([0, 1, 500, 999], results)
    assert [(a.failure.message, a.ranks) for a in differing] == [
        (
            "collective sequence differs from rank 0's (2 collectives, rank 0 2): "
            "at #0 forward all_gather float32 12 B, rank 0 forward all_gather float32 40 B",
            [1],
        ),
        (
            "collective sequence differs from rank 0's (3 collectives, rank 0 2): "
            "at #0 forward all_gather float32 12 B, rank 0 forward all_gather float32 40 B",
            [999],
        ),
    ]
    # both are the same failure by code and fields: where the sequences first differ, and how
    fields = {"at": 0, "got": "forward all_gather float32 12 B", "first_rank": "forward all_gather float32 40 B"}
    assert [(a.failure.code, a.failure.fields) for a in differing] == [("collectives.sequence", fields)] * 2
    assert sequences_differ([0, 1], [answer(same), answer(same)]) == []
    # a rank that issued fewer: "nothing" where the first rank issued one
    [short] = sequences_differ([0, 1], [answer(same), answer(same[:1])])
    assert short.ranks == [1] and short.failure.fields == {"at": 1, "got": "nothing", "first_rank": same[1]}
    assert AREA.across_ranks is sequences_differ  # the front end judges the ranks through the hook


def test_a_repro_names_the_profile_that_picked_its_cell() -> None:
    from pathlib import Path

    from conformance.reports.session import SessionInfo

    node = f"conformance/test_sharding.py::test_sharding[{SIM.id}]"
    scale = SessionInfo("gloo", 2, "scale", False, Path("xfails.toml"), True).repro(node)
    assert scale.endswith(f"test_sharding[{SIM.id}]' --nproc 2 --backend gloo --profile scale")
    assert "--profile" not in SessionInfo("gloo", 2, "ci", False, Path("xfails.toml"), True).repro(node)


def test_a_simulated_world_that_breaks_names_the_sampled_rank() -> None:
    from conformance.world import protocol
    from conformance.world.outcome import Outcome

    results = [protocol.RankResult(i, protocol.PASSED) for i in range(simulated.SAMPLED)]
    results[3] = protocol.RankResult(3, protocol.FAILED, error="Traceback: boom")
    told = Outcome(results, duration=1.0, startup=0.0).describe(list(simulated.sampled_ranks(1000)))
    assert told.startswith("--- rank 337: failed") and "boom" in told  # process 3 stands for rank 337


def test_string_order_slots_are_the_identity_on_every_real_world_of_ci() -> None:
    """Why the planted string-order records can fail on ci's simulated cells only: ci's real
    worlds are of at most 4 ranks, and string order moves no rank below 11."""
    real = {c.world_size for c in cells("ci", 2, {"legacy_jit_fsdp": "probed"}) if not c.simulated}
    assert max(real) <= 10
    assert all(permutations.decimal_order(n) == list(range(n)) for n in range(1, 11))
    assert permutations.decimal_order(11) != list(range(11))

"""What the profiles promise, read from the cells alone (no world is started), and the probe
they are chosen by, on the pin (in a world)."""

from __future__ import annotations

import collections

import pytest

from conformance.matrix.cells import AXES
from conformance.matrix.profiles import BOUNDARY_WORLD_SIZES, axis_values, cells, unmet_pairs, valid
from conformance.world import protocol
from conformance.world.controller import World
from conformance.world.launch import LaunchSpec
from fixtures.compositions import COMPOSITIONS
from fixtures.inits import INITS
from fixtures.models import MODELS
from fixtures.offloads import POLICIES

# what the worlds' probe finds on the kit's pin (test_the_pins_probe below holds it to that)
PIN_UNSUPPORTED = {"legacy_jit_fsdp": "thunder.distributed.fsdp(nn.Module) raises TypeError: ..."}
CI = cells("ci", 2, PIN_UNSUPPORTED)
RUNS = [c for c in CI if c.composition not in PIN_UNSUPPORTED]


def test_ci_meets_every_valid_pair_in_a_cell_that_runs() -> None:
    assert unmet_pairs(RUNS, 2, PIN_UNSUPPORTED) == []
    # the check itself: a pair the cells miss is named, an impossible one never is
    assert {"model": "litgpt_neox", "dtype": "bfloat16"} in unmet_pairs([c for c in RUNS if c.dtype != "bfloat16"], 2)
    assert not valid({"model": "no_reset", "tie": "tied"})
    assert {"model": "no_reset", "tie": "tied"} not in unmet_pairs([], 2)


def test_ci_gives_an_unsupported_composition_one_cell_and_its_pairs_to_the_others() -> None:
    assert len(CI) - len(RUNS) == 1
    # were every composition offered, the same profile would run it across the array
    every = cells("ci", 2, {})
    assert sum(c.composition == "legacy_jit_fsdp" for c in every) > 1
    assert unmet_pairs(every, 2) == []


def test_profiles_over_the_default_world_size_and_the_boundary_ones() -> None:
    sizes = collections.Counter(c.world_size for c in RUNS)
    assert set(sizes) == {2, *BOUNDARY_WORLD_SIZES}
    assert all(2 <= sizes[n] <= 3 for n in BOUNDARY_WORLD_SIZES), sizes
    for n in BOUNDARY_WORLD_SIZES:
        boundary = [c for c in RUNS if c.world_size == n]
        assert {c.sharding for c in boundary} >= {"zero3"}
        assert {"real_broadcast_first", "real_broadcast_last", "meta_transformed_sd"} & {c.init for c in boundary}
        # padding: each cell's model has a first dimension the world size does not divide
        for c in boundary:
            shapes = [p.shape for p in MODELS[c.model].build(c.tie == "tied").parameters()]
            assert any(s[0] % n for s in shapes), c
    inits = {c.init for c in RUNS if c.world_size in BOUNDARY_WORLD_SIZES}
    assert {"real_broadcast_first", "real_broadcast_last", "meta_transformed_sd"} <= inits
    full = cells("full", 2, PIN_UNSUPPORTED)
    for n in BOUNDARY_WORLD_SIZES:
        at_n = [c for c in full if c.world_size == n]
        assert at_n and unmet_pairs(at_n, n, PIN_UNSUPPORTED) == []


def test_smoke_keeps_its_probed_composition_cell() -> None:
    smoke = cells("smoke", 2, PIN_UNSUPPORTED)
    assert len(smoke) == 4
    assert any(COMPOSITIONS[c.composition].probe is not None for c in smoke)


def test_an_option_that_names_a_rank_is_tried_at_both_ends() -> None:
    for n in (2, *BOUNDARY_WORLD_SIZES):
        broadcasts = {c.init for c in RUNS if c.world_size == n and INITS[c.init].broadcast}
        assert {INITS[i].source(n) for i in broadcasts} == {0, n - 1}, n


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "none"])
def test_ci_runs_every_offload_policy_with_both_compositions_real_and_meta_init_and_a_tie(policy: str) -> None:
    runnable = [c for c in RUNS if c.offload == policy]
    assert {c.composition for c in runnable} == set(axis_values(2, PIN_UNSUPPORTED)["composition"])
    assert {INITS[c.init].on_meta for c in runnable} == {True, False}
    assert "tied" in {c.tie for c in runnable}


def test_every_axis_is_varied() -> None:
    values = axis_values(2, PIN_UNSUPPORTED)
    for axis in AXES:
        assert {getattr(c, axis) for c in RUNS} >= set(values[axis]), axis


@pytest.mark.slow  # starts a world
def test_the_pins_probe(tmp_path) -> None:
    world = World(LaunchSpec(nproc=2, backend="gloo"), base_dir=tmp_path)
    try:
        outcome = world.run(protocol.Task("conformance.rank.probe:probe_compositions"), timeout=120)
    finally:
        world.close()
    assert outcome.ok, outcome.describe()
    for answer in outcome.values:
        assert set(answer) == set(COMPOSITIONS)
        assert answer["legacy_jit_fsdp"].startswith("thunder.distributed.fsdp(nn.Module) raises TypeError")
        assert {n: r for n, r in answer.items() if n != "legacy_jit_fsdp"} == dict.fromkeys(
            set(COMPOSITIONS) - {"legacy_jit_fsdp"}
        )

"""What the profiles promise, read from the cells alone (no world is started), and the probe
they are chosen by, on the pin (in a world)."""

from __future__ import annotations

import collections
import itertools
import os
import subprocess
import sys

import pytest

from conformance.matrix.axes import axis_values, pairwise_values, replicated_values, valid
from conformance.matrix.cells import AXES
from conformance.matrix.coverage import unmet_combinations, unmet_pairs
from conformance.matrix.profiles import BOUNDARY_WORLD_SIZES, cells
from conformance.world import protocol
from conformance.world.controller import World
from conformance.world.launch import LaunchSpec
from fixtures.compositions import COMPOSITIONS, pairing
from fixtures.executors import EXECUTORS
from fixtures.inits import INITS
from fixtures.models import MODELS
from fixtures.offloads import POLICIES
from fixtures.options import BUCKETINGS, SCENARIOS
from fixtures.torch_parallel import ROOT_WRAP
from tests.support.suite_runs import ROOT, offered

# what the worlds' probe finds on the kit's pin on CPU (test_the_pins_probe below holds it to that)
PIN_UNSUPPORTED = {
    "legacy_jit_fsdp": "thunder.distributed.fsdp(nn.Module) raises TypeError: ...",
    "nvfuser": "nvFuser generates CUDA kernels only; this world's device is cpu",
    "plugins_fsdp with default": "thunder.compile's default recipe fuses with nvFuser ...",
    "plugins_ddp with default": "thunder.compile's default recipe fuses with nvFuser ...",
}
# one reported-unsupported cell each
STAND_INS = 4
CI = cells("ci", 2, PIN_UNSUPPORTED)


def runs(selected: list) -> list:
    """The real cells that run (simulated ones have tests/unit/test_scale.py)."""
    return [
        c
        for c in selected
        if offered(c, PIN_UNSUPPORTED) and not c.simulated
    ]


RUNS = runs(CI)
NIGHTLY = cells("nightly", 2, PIN_UNSUPPORTED)
NIGHTLY_RUNS = runs(NIGHTLY)


def test_ci_meets_every_valid_pair_in_a_cell_that_runs() -> None:
    assert unmet_pairs(RUNS, 2, PIN_UNSUPPORTED, profile="ci") == []
    # the check itself: a pair the cells miss is named, an impossible one never is
    assert {"model": "litgpt_neox", "dtype": "bfloat16"} in unmet_pairs([c for c in RUNS if c.dtype != "bfloat16"], 2)
    assert not valid({"model": "no_reset", "tie": "tied"})
    assert {"model": "no_reset", "tie": "tied"} not in unmet_pairs([], 2)


def test_ci_gives_an_unsupported_composition_one_cell_and_its_pairs_to_the_others() -> None:
    assert len([c for c in CI if not c.simulated]) - len(RUNS) == STAND_INS
    # were every composition offered, the same profile would run it across the array
    every = cells("ci", 2, {})
    assert sum(c.composition == "legacy_jit_fsdp" for c in every) > 1
    assert unmet_pairs(every, 2, profile="ci") == []


def tensor_parallel(cell) -> bool:
    return COMPOSITIONS[cell.composition].parallelism == "tensor"


def own_family(cell) -> bool:
    """A cell of a family with cells of its own, beside the arrays over every axis: tensor
    parallelism's, hybrid sharding's (at its one world size), resharded resumes (at their pairs
    of world sizes)."""
    return tensor_parallel(cell) or COMPOSITIONS[cell.composition].hybrid or cell.saved_at is not None


def test_profiles_over_the_default_world_size_and_the_boundary_ones() -> None:
    sizes = collections.Counter(c.world_size for c in RUNS if not own_family(c))
    assert set(sizes) == {2, *BOUNDARY_WORLD_SIZES}
    assert all(2 <= sizes[n] <= 4 for n in BOUNDARY_WORLD_SIZES), sizes
    for n in BOUNDARY_WORLD_SIZES:
        boundary = [c for c in RUNS if c.world_size == n and not own_family(c)]
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
    # DDP's compositions too: they are rows of ci's one array
    compositions = set(pairwise_values("ci", 2, PIN_UNSUPPORTED)["composition"])
    assert {"ddp_jit", "jit_ddp"} <= compositions
    assert {c.composition for c in runnable} >= compositions
    assert {INITS[c.init].on_meta for c in runnable} == {True, False}
    assert "tied" in {c.tie for c in runnable}


def test_every_axis_is_varied() -> None:
    values = axis_values(2, PIN_UNSUPPORTED)
    for axis in AXES:
        assert {getattr(c, axis) for c in RUNS} >= set(values[axis]), axis


def test_nightly_meets_every_valid_triple_in_a_cell_that_runs() -> None:
    at_2 = [c for c in NIGHTLY_RUNS if c.world_size == 2]
    assert unmet_combinations(at_2, 2, PIN_UNSUPPORTED, strength=3) == []
    # the check itself: a triple the cells miss is named, an impossible one never is
    missing = {"model": "tied_lm", "offload": "callback", "dtype": "bfloat16"}
    without = [c for c in at_2 if (c.model, c.offload, c.dtype) != ("tied_lm", "callback", "bfloat16")]
    assert missing in unmet_combinations(without, 2, PIN_UNSUPPORTED, strength=3)
    assert {"model": "no_reset", "tie": "tied", "dtype": "float32"} not in unmet_combinations([], 2, strength=3)
    # were every composition offered, the same profile would meet every triple with it too
    every = [c for c in cells("nightly", 2, {}) if c.world_size == 2]
    assert unmet_combinations(every, 2, strength=3) == []


def test_nightly_boundary_sizes_get_what_full_gives_them_and_everything_ci_picked_them_for() -> None:
    full = cells("full", 2, PIN_UNSUPPORTED)
    for n in BOUNDARY_WORLD_SIZES:
        at_n = [c for c in NIGHTLY_RUNS if c.world_size == n and not COMPOSITIONS[c.composition].hybrid]
        assert at_n == [c for c in full if c.world_size == n and not COMPOSITIONS[c.composition].hybrid]
        assert unmet_pairs(at_n, n, PIN_UNSUPPORTED) == []
        assert {"zero3"} <= {c.sharding for c in at_n}
        assert {"real_broadcast_first", "real_broadcast_last", "meta_transformed_sd"} <= {c.init for c in at_n}
        assert {INITS[c.init].source(n) for c in at_n if INITS[c.init].broadcast} == {0, n - 1}
    # the unsupported composition and executors keep their one cell each, as in ci
    assert len([c for c in NIGHTLY if not c.simulated]) - len(NIGHTLY_RUNS) == STAND_INS
    # a session whose own size is a boundary one covers it with triples, not twice
    at_3 = cells("nightly", 3, PIN_UNSUPPORTED)
    at_3_sizes = {c.world_size for c in at_3 if not c.simulated and not own_family(c)}
    assert at_3_sizes == {3, *(set(BOUNDARY_WORLD_SIZES) - {3})}


def test_nightly_is_the_same_in_every_process_and_its_size_is_the_readmes() -> None:
    # nights are compared cell by cell (conformance.compare): the array must not depend on
    # Python's salted hash
    code = (
        "from conformance.matrix.profiles import cells; "
        f"print('\\n'.join(c.id for c in cells('nightly', 2, {PIN_UNSUPPORTED!r})))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.split() == [c.id for c in NIGHTLY]
    readme = (ROOT / "README.md").read_text()
    assert f"`nightly` ({len(NIGHTLY)} cells" in readme


def test_tensor_parallelism_has_its_cells_in_ci_and_every_one_beyond() -> None:
    """ci: inference and training at 2 and 3 ranks (uneven shards at 3), on a toy MLP and both
    litgpt MLPs; nightly and full: every cell of the family at 2, 3 and 4 ranks; nothing of
    the family in any other array, and none of its values elsewhere."""
    picked = [c for c in RUNS if tensor_parallel(c)]
    assert {(c.scenario, c.world_size) for c in picked} == {(s, n) for s in ("inference", "train") for n in (2, 3)}
    assert {c.model for c in picked} == {m for m, f in MODELS.items() if f.tp_plan}
    for profile in ("nightly", "full"):
        family = [c for c in cells(profile, 2, PIN_UNSUPPORTED) if tensor_parallel(c)]
        assert len(family) == 3 * 2 * sum(len(f.ties) for f in MODELS.values() if f.tp_plan)
    assert all(c.scenario != "inference" for c in NIGHTLY if not tensor_parallel(c))
    assert not valid({"composition": "thunderfx_tp", "model": "tied_lm"})  # no plan
    assert not valid({"composition": "thunderfx_tp", "sharding": "zero3"})
    assert not valid({"composition": "jit_fsdp", "scenario": "inference"})


def test_hybrid_sharding_runs_at_four_ranks_alone_in_arrays_of_its_own() -> None:
    """ci: the plugin's default broadcast and one from the last rank, both at 4 ranks (a 2 x 2
    mesh); nightly a pairwise array of its values; no other array holds the composition, nor
    a world it cannot make a 2-D mesh of."""
    hybrid = [c for c in RUNS if COMPOSITIONS[c.composition].hybrid]
    assert {(c.init, c.world_size) for c in hybrid} == {("real", 4), ("real_broadcast_last", 4)}
    nightly = [c for c in NIGHTLY_RUNS if COMPOSITIONS[c.composition].hybrid]
    assert {c.world_size for c in nightly} == {4} and {c.scenario for c in nightly} == {"train"}
    assert {c.sharding for c in nightly} == {"zero2", "zero3"}
    assert not valid({"composition": "jit_hybrid", "world_size": 2})
    assert valid({"composition": "jit_hybrid", "world_size": 6})  # 3 rows of 2
    assert not valid({"composition": "jit_hybrid", "scenario": "resume"})


@pytest.mark.slow  # starts a world
def test_the_pins_probe(tmp_path) -> None:
    world = World(LaunchSpec(nproc=2, backend="gloo"), base_dir=tmp_path)
    try:
        outcome = world.run(protocol.Task("conformance.rank.probe:probe_compositions"), timeout=120)
    finally:
        world.close()
    assert outcome.ok, outcome.describe()
    offloading = {p for p, policy in POLICIES.items() if policy is not None}
    probed_executors = {e for e, choice in EXECUTORS.items() if choice.probe is not None}
    paired = {
        pairing(c, e)
        for c, composition in COMPOSITIONS.items()
        if composition.executors_probe is not None and c not in PIN_UNSUPPORTED
        for e in EXECUTORS
        if e not in PIN_UNSUPPORTED
    }
    for answer in outcome.values:
        assert set(answer) == set(COMPOSITIONS) | offloading | probed_executors | paired
        for name, reason in PIN_UNSUPPORTED.items():
            assert answer[name].startswith(reason.removesuffix("..."))
        # everything else runs on the pin, every offload policy included
        assert {n: r for n, r in answer.items() if n not in PIN_UNSUPPORTED} == dict.fromkeys(
            (set(COMPOSITIONS) | offloading | probed_executors | paired) - set(PIN_UNSUPPORTED)
        )


def test_an_unsupported_offload_keeps_one_cell_per_policy_and_the_rest_run_without_it() -> None:
    # as on a Thunder that cannot offload: every policy but none refused with one reason
    refused = {**PIN_UNSUPPORTED, **{p: "no TraceTag.AUGMENTED_FORWARD" for p in POLICIES if p != "none"}}
    selected = cells("ci", 2, refused)
    stand_ins = [c for c in selected if c.offload != "none"]
    assert sorted(c.offload for c in stand_ins) == sorted(p for p in POLICIES if p != "none")
    runs = [c for c in selected if c.offload == "none" and c.composition not in refused]
    assert unmet_pairs(runs, 2, refused, profile="ci") == []
    # the hand-picked boundary cells keep running, with their offload put back to none
    assert any(c.world_size == 3 and c.model == "mlp" and c.init == "real_broadcast_first" for c in runs)


def test_probed_value_names_never_collide_across_axes() -> None:
    # the probe answers one flat mapping of value names (conformance/matrix/axes.py)
    assert not set(COMPOSITIONS) & set(POLICIES)
    assert not (set(COMPOSITIONS) | set(POLICIES)) & set(EXECUTORS)


def test_an_executor_the_environment_offers_runs_across_the_array() -> None:
    # a GPU host with nvFuser installed (and torch.compile usable): every executor runs, and
    # every pair of values meets with each
    gpu_host = {"legacy_jit_fsdp": PIN_UNSUPPORTED["legacy_jit_fsdp"]}
    selected = [c for c in cells("ci", 2, gpu_host) if c.composition not in gpu_host and not c.simulated]
    assert unmet_pairs(selected, 2, gpu_host, profile="ci") == []
    assert {c.executors for c in selected} == set(EXECUTORS)
    # on the CPU pin the one that needs CUDA keeps one cell, reporting why
    stand_ins = [c for c in CI if c.executors in PIN_UNSUPPORTED]
    assert sorted(c.executors for c in stand_ins) == ["nvfuser"]


def test_ci_meets_every_scenario_pairwise_and_compiles_litgpt_again_only_for_its_pairs() -> None:
    # the scenario axis is grown onto ci's array last (conformance/matrix/growth.py): every
    # pair of a scenario and another axis's value meets in a cell that runs (test above),
    # and a litgpt cell (~9 s a compilation here, against ~1 s) takes a scenario beyond
    # training only for the one pair it alone can meet, its model with that scenario
    # (in the grown array; the coverage contract's top-up may add a litgpt cell of its own
    # where a feature only litgpt has must meet a family and scenario that no row met)
    from conformance.matrix.arrays import grown

    array = list(grown(pairwise_values("ci", 2, PIN_UNSUPPORTED), contract=False))
    beyond = [c for c in array if c.scenario != "train"]
    heavy = sorted(m for m, f in MODELS.items() if f.trace_s > 5)
    assert heavy
    assert sorted((c.model, c.scenario) for c in beyond if c.model in heavy) == sorted(
        itertools.product(heavy, set(SCENARIOS) - {"train"})
    )
    data_parallel = [c for c in RUNS if not tensor_parallel(c)]
    assert {(c.model, c.scenario) for c in data_parallel if c.model in heavy and c.scenario != "train"} == set(
        itertools.product(heavy, set(SCENARIOS) - {"train"})
    )
    # the models that train only are in the array, at every one of their pairs, training
    trains_only = [c for c in RUNS if MODELS[c.model].output_dropout is not None]
    assert trains_only and {c.scenario for c in trains_only} == {"train"}
    assert {c.init for c in trains_only} == set(INITS)
    assert {c.scenario for c in NIGHTLY_RUNS if not tensor_parallel(c)} == set(SCENARIOS)


def test_ddp_takes_rows_of_cis_array_and_has_nightly_arrays_of_its_own() -> None:
    # ci: DDP's compositions are grown onto the one array (every pair: the test above) in rows
    # at FSDP's default sharding, which does not apply to them; bucketing there names a bucket
    # size (buckets.ddp_buckets). nightly: a pairwise array over the values that apply
    thunders = [c for c in RUNS if COMPOSITIONS[c.composition].parallelism == "thunder"]
    ddp = [c for c in thunders if COMPOSITIONS[c.composition].replicated]
    assert {c.composition for c in ddp} == {
        name for name, c in COMPOSITIONS.items() if c.replicated and c.parallelism == "thunder"
    }
    assert all(c.sharding == "zero2" for c in ddp) and {c.bucketing for c in ddp} == set(BUCKETINGS)
    assert {c.scenario for c in ddp} == set(SCENARIOS) and {c.model for c in ddp} == set(MODELS)
    values = replicated_values(2, PIN_UNSUPPORTED)
    nightly = [
        c
        for c in NIGHTLY_RUNS
        if COMPOSITIONS[c.composition].replicated and COMPOSITIONS[c.composition].parallelism == "thunder"
    ]
    met = {frozenset(p) for c in nightly for p in itertools.combinations([(a, getattr(c, a)) for a in AXES], 2)}
    for a, b in itertools.combinations([a for a in AXES if a in values], 2):  # checkpointing: an array of its own
        for x in values[a]:
            for y in values[b]:
                refused = {a: x, b: y}.keys() == {"composition", "executors"} and pairing(
                    *(x, y) if a == "composition" else (y, x)
                ) in PIN_UNSUPPORTED
                if valid({a: x, b: y}) and not refused:
                    assert frozenset([(a, x), (b, y)]) in met, (a, x, b, y)


def test_ci_carries_pytorch_parallelism_in_an_array_of_its_own() -> None:
    """FSDP2 and DDP under Thunder: every composition offered, on a model with blocks and one
    without, every pair of composition and model, tie, dtype, FSDP2's resharding, init and
    scenario met (FSDP2's root wrap: where its units differ); none of them in the arrays of
    Thunder's own transforms."""
    from conformance.matrix.axes import torch_parallel_values
    from fixtures.compositions import COMPOSITIONS

    family = [c for c in RUNS if COMPOSITIONS[c.composition].parallelism == "torch"]
    values = torch_parallel_values(2, PIN_UNSUPPORTED)
    assert {c.composition for c in family} == set(values["composition"]) == {
        "thunderfx_fsdp2", "thunderfx_fsdp2_root", "fsdp2_jit", "jit_fsdp2", "thunderfx_torchddp", "torchddp_jit"
    }  # fmt: skip
    # FSDP2's compositions at every init they express (Lightning's meta init, DCP's full load)
    assert set(values["init"]) == {"real", "meta_module_init", "meta_original_sd"}
    # FSDP2 at the root alone: only its units differ from the blocks' wrap, and only on a model
    # with blocks, so ci holds them there at each resharding, in float32 and mixed precision
    root_wrap = {c for c in values["composition"] if COMPOSITIONS[c].fsdp2_wrap == ROOT_WRAP}
    assert root_wrap == {"thunderfx_fsdp2_root"}
    assert {(c.model, c.sharding, c.dtype) for c in family if c.composition in root_wrap} == {
        ("litgpt_llama", "zero3", "float32"), ("litgpt_llama", "zero2", "mixed_bfloat16")
    }  # fmt: skip
    for axis in ("model", "tie", "dtype", "sharding", "init", "scenario"):
        met = {(c.composition, getattr(c, axis)) for c in family}
        wanted = {
            (comp, v)
            for comp in values["composition"]
            for v in values[axis]
            if valid({"composition": comp, axis: v}) and comp not in root_wrap
        }
        assert wanted <= met, (axis, sorted(wanted - met))
    scenarios = {"train", "infer", "accumulate", "reshape", "resume"}
    assert {c.scenario for c in family} == set(values["scenario"]) == scenarios
    assert {c.init for c in family if COMPOSITIONS[c.composition].replicated} == {"real"}

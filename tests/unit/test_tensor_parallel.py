"""Tensor parallelism's judgment, on records made by hand: Megatron's arithmetic as
checks/megatron.py derives it, and each area's check of the family failing on exactly the
defect planted in an otherwise conforming record (a shard on the wrong dim, a collective
missing, an output off by a little more than the tolerance, a Linear split off Thunder)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conformance.checks import collectives, compiled, megatron, memory, sharding
from conformance.checks.numerics import tensor_parallel as numerics
from conformance.checks.numerics.tolerances import FLOAT32
from conformance.checks.record import (
    Issued,
    LayerCall,
    Placed,
    PlannedLayer,
    ReachedThunder,
    TensorParallelRecord,
    TensorParallelStep,
)
from conformance.matrix.cells import Cell
from fixtures.models import MODELS
from fixtures.tensor_parallel import COLWISE, ROWWISE, planned

# the toy MLP's plan at 3 ranks: 20 hidden rows cut 7, 7, 6
FC1 = PlannedLayer("fc1", COLWISE, [LayerCall((4, 12), (4, 20), False, 4)])
FC2 = PlannedLayer("fc2", ROWWISE, [LayerCall((4, 20), (4, 7), True, 4)])
SHAPES = {"fc1.weight": (20, 12), "fc1.bias": (20,), "fc2.weight": (7, 20), "fc2.bias": (7,)}


def _record(rank: int = 2, world: int = 3, trained: bool = False) -> TensorParallelRecord:
    """A conforming record of the MLP on ``rank``: every parameter placed as the plan says, the
    collectives Megatron's arithmetic owes, outputs equal to both references, every Linear in
    Thunder."""
    wanted = megatron.placements([FC1, FC2], list(SHAPES))
    placements = {
        n: Placed(wanted[n], world if wanted[n] else None, megatron.local_shape(s, wanted[n], rank, world))
        for n, s in SHAPES.items()
    }
    out = torch.linspace(-1, 1, 28).reshape(4, 7)
    issued = [Issued("forward", "all_reduce", "float32", 4 * 7 * 4)]
    step = TensorParallelStep(output=out.clone(), eager=out.clone(), eager_tp=out.clone(), issued=issued)
    if trained:
        # the model's input needs no gradient: fc1 all-reduces nothing in the backward
        grads = {n: torch.ones(s) for n, s in SHAPES.items()}
        step = dataclasses.replace(
            step,
            grads=grads,
            eager_grads={n: g.clone() for n, g in grads.items()},
            eager_tp_grads={n: g.clone() for n, g in grads.items()},
            after=grads,
            eager_after=dict(grads),
            eager_tp_after=dict(grads),
        )
    scenario = "train" if trained else "inference"
    return TensorParallelRecord(
        cell=Cell("mlp", "real", "thunderfx_tp", scenario=scenario, world_size=world),
        rank=rank,
        world_size=world,
        shapes=SHAPES,
        layers=[FC1, FC2],
        placements=placements,
        steps=[step],
        reached=ReachedThunder(3, 0, [], {}, {"THUNDER": {"linear": 2, "gelu": 1}}),
        timings={},
        alive_after_setup=4 * sum(megatron.held_elements(s, wanted[n], rank, world) for n, s in SHAPES.items()),
    )


def _codes(findings) -> list[tuple[str, dict]]:
    assert findings.crash is None, findings.crash
    return [(f.code, f.fields) for f in findings.found]


def test_megatron_owes_one_all_reduce_per_row_wise_call_forward_and_per_column_wise_input_gradient_backward() -> None:
    assert megatron.expected([FC1, FC2], trained=False) == {"forward": {"all_reduce": megatron.Expected(1, 112)}}
    gated = [
        PlannedLayer("fc_1", COLWISE, [LayerCall((2, 8, 24), (2, 8, 40), True, 4)]),
        PlannedLayer("fc_2", COLWISE, [LayerCall((2, 8, 24), (2, 8, 40), True, 4)]),
        PlannedLayer("proj", ROWWISE, [LayerCall((2, 8, 40), (2, 8, 24), True, 4)]),
    ]
    want = megatron.expected(gated, trained=True)
    # LLaMA's two gates each all-reduce their input's gradient; the MLP's model input needs none
    assert want["forward"]["all_reduce"] == megatron.Expected(1, 2 * 8 * 24 * 4)
    assert want["backward"]["all_reduce"] == megatron.Expected(2, 2 * 2 * 8 * 24 * 4)
    assert megatron.expected([FC1, FC2], trained=True)["backward"]["all_reduce"] == megatron.Expected()


def test_a_shard_is_cut_as_torch_chunk_cuts_uneven_dims() -> None:
    rows = (megatron.SHARD_ROWS,)
    assert [megatron.local_shape((20, 12), rows, r, 3) for r in range(3)] == [(7, 12), (7, 12), (6, 12)]
    assert [megatron.local_shape((2, 5), rows, r, 4) for r in range(4)] == [(1, 5), (1, 5), (0, 5), (0, 5)]
    assert megatron.local_shape((7, 20), (megatron.SHARD_COLUMNS,), 2, 3) == (7, 6)
    assert megatron.local_shape((7,), (megatron.REPLICATE,), 1, 3) == (7,)


def test_a_short_piece_on_dim_0_is_held_in_its_padded_storage() -> None:
    """As DTensor's scatter leaves it: the piece narrowed on dim 0 is a view of the padded one;
    on dim 1 a copy of the narrowed piece."""
    assert megatron.held_elements((20, 12), (megatron.SHARD_ROWS,), 2, 3) == 7 * 12
    assert megatron.held_elements((7, 20), (megatron.SHARD_COLUMNS,), 2, 3) == 7 * 6
    assert megatron.held_elements((7,), None, 2, 3) == 7


def test_a_whole_copy_of_a_split_weight_kept_after_setup_is_memorys_finding() -> None:
    run = _record()
    assert run.alive_after_setup == 4 * (7 * 12 + 7 + 7 * 6 + 7)  # rank 2 of 3
    run.alive_after_setup += 4 * 20 * 12  # fc1's weight kept whole beside its shard
    codes = _codes(memory.check_tensor_parallel(run))
    assert codes == [("memory.held_after_setup", {"held": run.alive_after_setup, "excess": 960, "cause": "kept"})]
    run.alive_after_setup -= 4 * 20 * 12 + 4  # one element less than held: no finding (0-d storages aside)
    assert _codes(memory.check_tensor_parallel(run)) == []


def test_every_fixture_plan_names_linears_of_its_model() -> None:
    for name, fixture in MODELS.items():
        if fixture.tp_plan:
            with torch.device("meta"):
                layers = planned(fixture.build(False), fixture.tp_plan)
            assert {p.style for p in layers} == {COLWISE, ROWWISE}, name
    with pytest.raises(ValueError, match="names no Linear"):
        planned(torch.nn.Sequential(torch.nn.Linear(2, 2)), {"fc*": COLWISE})


@pytest.mark.parametrize("trained", [False, True], ids=["inference", "train"])
def test_a_conforming_record_passes_every_area(trained: bool) -> None:
    run = _record(trained=trained)
    checks = (sharding.check_tensor_parallel, collectives.check_tensor_parallel, numerics.check)
    for check in (*checks, memory.check_tensor_parallel, compiled.check_tensor_parallel):
        assert _codes(check(run)) == [], check


def test_a_row_wise_weight_sharded_on_the_wrong_dim_is_named() -> None:
    run = _record()
    run.placements["fc2.weight"] = Placed((megatron.SHARD_ROWS,), 3, (3, 20))
    codes = _codes(sharding.check_tensor_parallel(run))
    assert codes[0] == ("sharding.placement", {"name": "fc2.weight"})
    assert [c for c, _ in codes] == ["sharding.placement", "sharding.elements"]


def test_a_parameter_left_whole_where_the_plan_shards_it_is_named() -> None:
    run = _record()
    run.placements["fc1.bias"] = Placed(None, None, (20,))
    assert ("sharding.placement", {"name": "fc1.bias"}) in _codes(sharding.check_tensor_parallel(run))


def test_a_row_wise_output_not_all_reduced_is_a_count_off_by_one() -> None:
    run = _record()
    run.steps[0].issued.clear()
    codes = _codes(collectives.check_tensor_parallel(run))
    got = [(c, f["phase"], f["kind"], f["got"]) for c, f in codes]
    assert got == [("collectives.count", "forward", "all_reduce", 0)]


def test_an_output_just_beyond_the_tolerance_is_numerics_finding_against_both_references() -> None:
    run = _record()
    step = run.steps[0]
    step.output = step.output.clone()
    step.output[0, 0] += 2.5 * (FLOAT32["atol"] + FLOAT32["rtol"] * step.output[0, 0].abs())
    codes = _codes(numerics.check(run))
    assert [(c, f["reference"], f["problem"]) for c, f in codes] == [
        ("numerics.tensor", "eager", "values"),
        ("numerics.tensor", "eager_tp", "values"),
    ]
    within = _record()
    within.steps[0].output[0, 0] += 0.5 * FLOAT32["atol"]
    assert _codes(numerics.check(within)) == []


def test_a_gradient_off_after_training_is_named() -> None:
    run = _record(trained=True)
    run.steps[0].grads["fc2.bias"] = run.steps[0].grads["fc2.bias"] * 1.001
    codes = _codes(numerics.check(run))
    assert {(f["name"], f["reference"]) for _, f in codes} == {("fc2.bias", "eager"), ("fc2.bias", "eager_tp")}


def test_a_planned_linear_split_off_thunder_is_named_with_how_many() -> None:
    run = _record()
    pieces = {"THUNDER": {"gelu": 1}, "TORCH_INDUCTOR": {"linear": 2}}
    run.reached = ReachedThunder(1, 0, ["EXCEPTION_META_THUNDER_OP: no VJP"], {}, pieces)
    codes = _codes(compiled.check_tensor_parallel(run))
    assert codes == [("compiled.split_off", {"outside": 2})]
    assert compiled.check_tensor_parallel(run).found[0].derived == {"planned": 2}

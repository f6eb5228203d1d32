"""The checks of the scenarios after training (conformance/rank/scenarios/), on records built
here: what each must find, named as an xfails entry can pin it, and what it must pass."""

from __future__ import annotations

import types

import pytest
import torch

from conformance.checks import collectives
from conformance.checks.checkpoint_record import Compared, RankZeroOnly, Resumed
from conformance.checks.collectives import expected_counts, scenario_counts
from conformance.checks.findings import Findings
from conformance.checks.numerics.scenarios import judge_scenario
from conformance.checks.record import ScenarioRecord
from conformance.checks.state_dict import RAISED, judge_rank0_only, judge_resumed
from conformance.checks.traces import FinalTraces
from conformance.rank.raised import origin
from fixtures.toy_models import MLP, LoRA

WHAT = "gradients accumulated over 2 micro-steps"


def _grads(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(5, 3, generator=gen), "b": torch.randn(5, generator=gen)}


def _accumulated(grads: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> ScenarioRecord:
    """An accumulate record whose eager micro-steps are ``_grads(0)`` and ``_grads(1)``,
    Thunder's gradients ``grads``; below float32, the twin holds the float32 values."""
    first, last = _grads(0), _grads(1)
    total = {n: first[n] + last[n] for n in first}
    low = dtype != torch.float32

    def cast(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {n: v.to(dtype) for n, v in t.items()}

    return ScenarioRecord(
        "accumulate",
        grads=cast(grads),
        eager_grads=cast(total),
        twin_grads=total if low else None,
        alternatives={
            "the last micro-step's alone": (cast(last), last if low else None),
            "the skipped micro-steps' alone": (cast(first), first if low else None),
        },
    )


def _judged(record: ScenarioRecord, dtype: torch.dtype = torch.float32) -> Findings:
    found = Findings()
    judge_scenario(found, record, dtype, world=2)
    return found


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_accumulated_gradients_equal_to_the_sum_pass(dtype: torch.dtype) -> None:
    total = {n: _grads(0)[n] + _grads(1)[n] for n in _grads(0)}
    assert _judged(_accumulated(total, dtype), dtype).failures == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["the last micro-step's alone", "the skipped micro-steps' alone"])
def test_a_lost_micro_step_is_named(dtype: torch.dtype, which: str) -> None:
    grads = _grads(1) if which.startswith("the last") else _grads(0)
    assert _judged(_accumulated(grads, dtype), dtype).failures == [f"{WHAT}: equal {which}"]


def test_gradients_off_by_one_percent_fail_per_tensor() -> None:
    off = {n: (_grads(0)[n] + _grads(1)[n]) * 1.01 for n in _grads(0)}
    failures = _judged(_accumulated(off)).failures
    assert sorted(f.split(":")[0] for f in failures) == [f"{WHAT} [b]", f"{WHAT} [w]"]


def test_what_thunder_produced_wrong_is_a_finding_not_a_crash() -> None:
    total = {n: _grads(0)[n] + _grads(1)[n] for n in _grads(0)}
    broken = {"w": torch.full((5, 3), float("nan")), "b": total["b"][:4]}
    failures = _judged(_accumulated(broken)).failures
    assert {f.split(":")[0] for f in failures} == {f"{WHAT} [w]", f"{WHAT} [b]"}
    missing = _judged(_accumulated({"w": total["w"]})).failures
    assert missing == [f"{WHAT} [b]: missing"]


def test_what_thunder_raised_names_its_kind_first() -> None:
    failures = _judged(ScenarioRecord("reshape", error="RuntimeError: no")).failures
    assert failures == ["output at the second input shape: Thunder raised RuntimeError\nRuntimeError: no"]


def test_a_no_grad_output_that_asks_for_a_gradient_fails() -> None:
    out = torch.ones(2, 3)
    record = ScenarioRecord("infer", output=out, eager_output=out, requires_grad=True)
    assert [f.split(":")[0] for f in _judged(record).failures] == ["output under no_grad needs no gradient"]


@pytest.mark.parametrize("model", [MLP, LoRA], ids=["mlp", "lora"])
@pytest.mark.parametrize("sharding", ["zero2", "zero3"])
def test_scenario_counts_follow_from_the_training_expectation(model: type, sharding: str) -> None:
    module = model()
    trained = expected_counts(module, sharding, "none")
    storages = len({p.data_ptr() for p in module.parameters()})
    trainable = len({p.data_ptr() for p in module.parameters() if p.requires_grad})
    assert trained["forward"]["all_gather"] == storages and trained["backward"]["reduce_scatter"] == trainable
    regather = storages if sharding == "zero3" else 0
    # under no_grad: the training forward's gathers, nothing reduced, no backward at all
    assert scenario_counts("infer", trained) == {
        "forward": ("no_grad forward", {"all_gather": storages, "reduce_scatter": 0, "all_reduce": 0})
    }
    # a skipped sync gathers as training does and reduces nothing
    skipped = scenario_counts("accumulate", trained)
    assert skipped["forward"] == ("no_sync forward", trained["forward"])
    assert skipped["backward"] == ("no_sync backward", {"all_gather": regather, "reduce_scatter": 0, "all_reduce": 0})
    # a second input shape changes no count
    reshaped = scenario_counts("reshape", trained)
    assert {phase: counts for phase, (_, counts) in reshaped.items()} == trained


def _trace(**counts: int) -> types.SimpleNamespace:
    """A trace of bound symbols that issues ``counts`` collectives of each kind (none declares
    an output: the gathered bytes are 0)."""
    from thunder.distributed.prims import PrimIDs

    ids = {"all_gather": PrimIDs.ALL_GATHER, "reduce_scatter": PrimIDs.REDUCE_SCATTER}
    bsyms = [
        types.SimpleNamespace(sym=types.SimpleNamespace(id=ids[kind]), subsymbols=(), flat_proxy_outs=[])
        for kind, n in counts.items()
        for _ in range(n)
    ]
    return types.SimpleNamespace(bound_symbols=bsyms)


@pytest.mark.parametrize(("bucketing", "reduced"), [("none", 4), ("layer", 2), ("layer", 4)])
def test_a_skipped_sync_that_reduces_as_a_training_step_does_is_named_so(bucketing: str, reduced: int) -> None:
    # MLP: 4 parameters in 2 layers. Under layer buckets the training step reduces 2 buckets;
    # a skipped sync that reduces 4 reduces as a training step whose bucketing is not applied
    # does (the pin's compound of two known bugs): both are "the training's count"
    module = MLP()
    expected = expected_counts(module, "zero2", bucketing)
    alternatives = collectives.alternative_counts(module, "zero2", bucketing)
    gathers = expected["forward"]["all_gather"]
    record = types.SimpleNamespace(
        scenario="accumulate",
        traces=FinalTraces(_trace(all_gather=gathers), _trace(reduce_scatter=reduced)),
    )
    found = Findings()
    collectives.judge_scenario(found, record, expected, alternatives, gathered_bytes=0)
    assert found.failures == [f"no_sync backward reduce_scatters: expected 0, got {reduced} (the training's count)"]
    # one that reduces some other number is not named
    record.traces = FinalTraces(_trace(all_gather=gathers), _trace(reduce_scatter=3))
    found = Findings()
    collectives.judge_scenario(found, record, expected, alternatives, gathered_bytes=0)
    assert found.failures == ["no_sync backward reduce_scatters: expected 0, got 3"]


def _resumed(**changes) -> Resumed:
    """A full checkpoint's round trip that conforms, with ``changes`` applied."""
    weights = _grads(3)
    record = Resumed(
        "full",
        taken={k: v.clone() for k, v in weights.items()},
        truth={k: v.clone() for k, v in weights.items()},
        compared=[Compared("weights after loading", dict(weights), dict(weights))],
    )
    for name, value in changes.items():
        setattr(record, name, value)
    return record


def test_a_conforming_round_trip_finds_nothing() -> None:
    found = Findings()
    judge_resumed(found, _resumed(), {"w", "b"})
    assert found.failures == []


def test_a_resumed_module_that_differs_anywhere_fails_exactly() -> None:
    weights = _grads(3)
    off = {"w": weights["w"], "b": weights["b"] + 1e-7}  # one ulp-scale change: bit for bit means bit for bit
    found = Findings()
    judge_resumed(found, _resumed(compared=[Compared("weights after loading", off, weights)]), {"w", "b"})
    assert [f.split(":")[0] for f in found.failures] == ["full checkpoint resumed"]
    assert found.failures[0].startswith("full checkpoint resumed: weights after loading [b]")


def test_what_thunder_got_wrong_in_a_checkpoint_is_a_finding_never_a_crash() -> None:
    weights = _grads(3)
    wrong = {"w": torch.full((5, 3), float("nan")), "b": weights["b"][:2], "stray": weights["b"]}
    found = Findings()
    judge_resumed(
        found,
        _resumed(taken=wrong, api_error="RuntimeError: no CUDA", error="KeyError: 'b'", compared=[]),
        {"w", "b"},
    )
    heads = [f.split("\n")[0] for f in found.failures]
    assert heads[0] == "full checkpoint: thunder.distributed.checkpoint.get_model_state_dict raised RuntimeError"
    assert "full checkpoint keys: missing [], unexpected ['stray']" in heads
    assert any(h.startswith("full checkpoint after training [w]") for h in heads)  # NaN
    assert any(h.startswith("full checkpoint after training [b]") for h in heads)  # a wrong shape
    assert heads[-1] == "full checkpoint resumed: Thunder raised KeyError"


def _on_rank(rank: int, **changes) -> RankZeroOnly:
    """rank0_only's take and load on ``rank`` as Thunder documents them, with ``changes``."""
    weights, fresh = _grads(3), _grads(4)
    record = RankZeroOnly(
        rank=rank,
        truth=dict(weights),
        checkpoint=dict(weights),
        taken=dict(weights) if rank == 0 else {},
        untouched=dict(fresh),
        loaded=dict(weights) if rank == 0 else dict(fresh),
    )
    for name, value in changes.items():
        setattr(record, name, value)
    return record


@pytest.mark.parametrize(
    "record",
    [_on_rank(0), _on_rank(1), _on_rank(1, loaded=_grads(3)), _on_rank(1, taken=None)],
    ids=["rank 0", "rank 1 keeps its own", "rank 1 gets rank 0's (a broadcast)", "the take raised"],
)
def test_rank0_only_as_documented_finds_nothing(record: RankZeroOnly) -> None:
    found = Findings()
    judge_rank0_only(found, record, {"w", "b"})
    assert found.failures == []


def test_rank0_only_taken_or_loaded_on_the_wrong_rank_is_found() -> None:
    weights, fresh = _grads(3), _grads(4)
    found = Findings()
    judge_rank0_only(found, _on_rank(1, taken=dict(weights)), {"w", "b"})
    judge_rank0_only(found, _on_rank(0, loaded=dict(fresh)), {"w", "b"})
    judge_rank0_only(found, _on_rank(1, loaded={"w": weights["w"], "b": fresh["b"]}), {"w", "b"})  # a mix
    heads = [f.split("\n")[0] for f in found.failures]
    assert heads[0] == "full checkpoint with rank0_only: rank 1 takes nothing: it took 2 tensors: ['b', 'w']"
    assert {h.split(" [")[0] for h in heads[1:]} == {
        "full checkpoint with rank0_only loaded: rank 0's the checkpoint",
        "full checkpoint with rank0_only loaded: rank 1's, given nothing, neither kept nor the checkpoint",
    }
    assert heads[-1].startswith(
        "full checkpoint with rank0_only loaded: rank 1's, given nothing, neither kept nor the checkpoint [b]"
    )


def test_whatever_rank0_only_loaded_is_a_finding_never_a_crash() -> None:
    weights = _grads(3)
    odd = {"w": torch.empty(5, 3, device="meta"), "b": weights["b"].double(), "stray": weights["b"][:1]}
    found = Findings()
    judge_rank0_only(found, _on_rank(1, loaded=odd, untouched={"w": weights["w"][:2]}), {"w", "b"})
    judge_rank0_only(found, _on_rank(0, error="KeyError: 'w'"), {"w", "b"})
    heads = [f.split("\n")[0] for f in found.failures]
    assert found.crash is None
    neither = "full checkpoint with rank0_only loaded: rank 1's, given nothing, neither kept nor the checkpoint"
    assert any(h.startswith(f"{neither} [w]") for h in heads)  # on meta
    assert any(h.startswith(f"{neither} [b]") for h in heads)  # float64
    assert any("[stray]: present where eager has none" in h for h in heads)
    assert heads[-1] == "full checkpoint with rank0_only loaded: Thunder raised KeyError"


def test_what_taking_a_checkpoint_raised_names_whose_code_raised_it() -> None:
    """The pin's raise on a gloo world is torch's (a CUDA mesh); a raise of Thunder's own code
    in the same call (rank0_only refused, a module taken for unsharded) is another finding."""
    found = Findings()
    judge_rank0_only(found, _on_rank(0, taken=None, take_error="ValueError: no", take_origin="thunder"), {"w", "b"})
    judge_resumed(found, _resumed(api_error="RuntimeError: no NVIDIA driver", api_origin="torch"), {"w", "b"})
    fields = [(f.fields["dict"], f.fields["raised"], f.fields["origin"]) for f in found.found if f.code == RAISED]
    assert fields[0] == ("full checkpoint with rank0_only", "ValueError", "thunder")
    assert fields[1] == ("full checkpoint", "RuntimeError", "torch")


def test_the_origin_of_a_raise_is_its_innermost_frames_package() -> None:
    def innermost(call) -> str:
        try:
            call()
        except Exception as exc:
            return origin(exc)
        raise AssertionError("it did not raise")

    assert innermost(lambda: torch.nn.functional.softmax(torch.ones(2), dim=5)) == "torch"
    assert innermost(lambda: int("x")) == "test_scenarios"  # raised in C, the innermost Python frame is here
    assert origin(ValueError("never raised")) == "builtins"

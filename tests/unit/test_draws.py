"""The module-init expectations of the materialization area (conformance/checks/draws.py,
distributions.py, initial_values.py), on synthetic values: every tensor can fail, whatever
Thunder hands over never crashes the check, and a tied weight names the owner it was drawn like."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conformance.checks import draws, power
from conformance.checks.distributions import Dist, judge, uniform
from conformance.checks.initial_values import Problem, check_values, shard_copies
from fixtures.models import MODELS
from fixtures.toy_models import TinyLM


def expect(build):
    return draws.expectations(build)


def test_registry_from_the_eager_model() -> None:
    exp = expect(lambda: TinyLM(tie=False))
    assert exp["mid.weight"].fits == [("Linear", uniform(-0.25, 0.25))]
    assert exp["emb.weight"].fits == [("Embedding", Dist("normal", 0.0, 1.0))]
    assert exp["norm.weight"].fits == [("LayerNorm", Dist("constant", 1.0))]
    assert not exp["norm.bias"].random and exp["mid.bias"].random


def test_the_tied_owner_is_the_one_eager_keeps() -> None:
    tied = expect(lambda: MODELS["litgpt_llama"].build(True))["lm_head.weight"]
    assert [cls for cls, _ in tied.fits] == ["Embedding"] and [cls for cls, _ in tied.others] == ["Linear"]
    # Thunder's values, drawn by the first owner (lm_head, a Linear); seeded, since the tests
    # reject a true draw 3 times in 100,000
    torch.manual_seed(0)
    drawn = nn.Linear(24, 37).weight.detach()
    found = check_values(drawn, tied, torch.float32)[0]
    assert found.fields == {"problems": ["drawn_like"], "drawn_like": "Linear", "expected_like": "Embedding"}
    assert found.message == "drawn like Linear.reset_parameters, not like Embedding.reset_parameters"
    assert check_values(torch.randn(37, 24), tied, torch.float32)[0] is None


def test_a_few_values_just_outside_fail() -> None:
    exp = expect(lambda: TinyLM(tie=False))["mid.weight"]
    torch.manual_seed(0)
    assert check_values(nn.Linear(16, 16).weight.detach(), exp, torch.float32)[0] is None
    wider = nn.Linear(16, 16).weight.detach() * 1.05
    found = check_values(wider, exp, torch.float32)[0]
    assert found.fields == {"problems": ["not_drawn_like"], "expected_like": "Linear"}
    assert "values outside [-0.25" in found.message


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_constant_tensors_fail(dtype) -> None:
    exp = expect(lambda: nn.Linear(20, 4))["bias"]  # 4 elements: too few for the other tests to fail them
    found = check_values(torch.full((4,), 0.1, dtype=dtype), exp, dtype)[0]
    assert found.fields["problems"] == ["not_drawn_like"] and "all 4 values equal" in found.message
    assert check_values(torch.tensor([0.1, -0.2, 0.05, 0.0], dtype=dtype), exp, dtype)[0] is None


def test_constants_exactly() -> None:
    exp = expect(lambda: nn.LayerNorm(5))
    assert check_values(torch.ones(5), exp["weight"], torch.float32)[0] is None
    found = check_values(torch.tensor([1, 1, 1, 1, 1 + 1e-6]), exp["weight"], torch.float32)[0]
    assert found.fields == {"problems": ["not_drawn_like"], "expected_like": "LayerNorm"}
    assert found.message.startswith("1 of 5 values differ from 1")


def test_what_thunder_produced_never_crashes() -> None:
    exp = expect(lambda: TinyLM(tie=False))["emb.weight"]
    bad = torch.randn(33, 16)
    bad[3, 4], bad[5, 6] = float("nan"), float("inf")
    assert check_values(bad, exp, torch.float32)[0] == Problem(
        "2 of 528 values not finite (1 NaN)", {"problems": ["not_finite"]}
    )
    assert check_values(None, exp, torch.float32)[0] == Problem("missing", {"problems": ["missing"]})
    assert check_values(torch.randn(3), exp, torch.float32)[0] == Problem(
        "shape (3,), expected (33, 16)", {"problems": ["shape"]}
    )
    assert check_values([1.0], exp, torch.float32)[0] == Problem("not a tensor: list", {"problems": ["not_a_tensor"]})
    found = check_values(torch.randn(33, 16, dtype=torch.float64), exp, torch.float32)[0]
    assert found == Problem("dtype torch.float64, expected torch.float32", {"problems": ["dtype"]})
    found = check_values(torch.zeros(33, 16, dtype=torch.int64), exp, torch.float32)[0]
    assert found.fields["problems"][0] == "dtype" and found.message.startswith("dtype")
    # each kind found is named, in the order of the message
    both = check_values(torch.full((33, 16), float("nan"), dtype=torch.float64), exp, torch.float32)[0]
    assert both.fields == {"problems": ["dtype", "not_finite"]}
    assert both.message == "dtype torch.float64, expected torch.float32; 528 of 528 values not finite (528 NaN)"


def test_narrower_draws_fail_the_scale_test() -> None:
    exp = expect(lambda: TinyLM(tie=False))["emb.weight"]
    torch.manual_seed(0)
    found, ratio = check_values(torch.randn(33, 16) * 0.5, exp, torch.float32)
    assert found.fields == {"problems": ["not_drawn_like"], "expected_like": "Embedding"}
    assert found.message.startswith("std 0.50") and "chi-square" in found.message and ratio > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_64_value_uniform_narrowed_by_a_fifth_always_fails(dtype) -> None:
    dist = uniform(-0.25, 0.25)
    torch.manual_seed(0)
    for _ in range(50):
        true = torch.empty(64).uniform_(-0.25, 0.25)
        assert judge(true.to(dtype), dist)[0] is None
        assert "values within ±" in judge((true * 0.8).to(dtype), dist)[0]


def test_a_shifted_mean_fails_the_mean_test() -> None:
    torch.manual_seed(0)
    found = judge(torch.randn(2000) + 0.2, Dist("normal", 0.0, 1.0))[0]
    assert found.startswith("mean ") and "shifted by +0.2" in found


def test_false_alarms_stay_near_alpha() -> None:
    """Seeded true draws of both kinds: the tests reject at most a few of 4,000 at 3 x ALPHA
    per tensor (the expected count is 0.12)."""
    torch.manual_seed(1)
    fails = 0
    for n in (8, 64, 528):
        for _ in range(1000 if n < 528 else 333):
            fails += judge(torch.empty(n).uniform_(-1, 1), uniform(-1, 1))[0] is not None
            fails += judge(torch.randn(n), Dist("normal", 0.0, 1.0))[0] is not None
    assert fails <= 2


def test_the_power_the_docs_state() -> None:
    assert power.smallest("uniform") == power.Powered(narrower=52, wider=13, shifted=39)
    assert power.smallest("normal") == power.Powered(narrower=355, wider=458, shifted=812)
    assert power.scale_power("uniform", 64, 0.8) == 1.0 and power.shift_power("normal", 888, 0.2) > 0.9
    sizes = {"w": (uniform(-1, 1), 64, 0), "b": (uniform(-1, 1), 8, 72), "e": (Dist("normal", 0.0, 1.0), 528, 0)}
    assert power.under_powered(sizes) == {"e": "528 values: misses mean +0.2 std"}


class Custom(nn.Module):
    """Not in the registry: one random and one deterministic parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(40))
        self.g = nn.Parameter(torch.empty(3))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.w, std=0.1)
        nn.init.constant_(self.g, 0.5)


def test_fallback_from_fresh_eager_draws() -> None:
    exp = expect(Custom)
    assert exp["w"].empirical == "random" and "KS test only" in exp["w"].describe()
    assert exp["g"].empirical == "deterministic"
    assert check_values(torch.full((3,), 0.5), exp["g"], torch.float32)[0] is None
    fixed = check_values(torch.full((3,), 0.25), exp["g"], torch.float32)[0]
    assert fixed.fields == {"problems": ["differs_from_eager"]} and "draws nothing at random" in fixed.message
    torch.manual_seed(0)
    assert check_values(torch.randn(40) * 0.1, exp["w"], torch.float32)[0] is None
    shifted = check_values(torch.randn(40) * 0.1 + 0.2, exp["w"], torch.float32)[0]
    assert shifted.fields == {"problems": ["not_like_fresh"]}
    assert shifted.message.startswith("not distributed like a fresh draw of Custom.reset_parameters: KS statistic")
    constant = check_values(torch.full((40,), 0.01), exp["w"], torch.float32)[0]
    assert constant.fields == {"problems": ["constant"]} and "all 40 values equal" in constant.message


@pytest.mark.parametrize("world", [2, 3, 4])
def test_shards_are_not_copies(world) -> None:
    full = torch.randn(37, 24)
    assert shard_copies(full, world)[0] is None
    chunk = math.ceil(37 / world)
    copied = full.clone()
    for r in range(1, world):
        rows = copied[r * chunk : (r + 1) * chunk]
        rows.copy_(copied[: len(rows)])
    found, compared, _ = shard_copies(copied, world)
    assert compared == world * (world - 1) // 2
    assert found.startswith("shards of ranks 0 and 1 (") and "copies" in found
    # one rank's shard copied from another's, over the rows both hold (the last is partial)
    last = full.clone()
    last[(world - 1) * chunk :] = last[: 37 - (world - 1) * chunk]
    assert f"0 and {world - 1} ({37 - (world - 1) * chunk} rows)" in shard_copies(last, world)[0]


def test_shards_too_small_to_compare() -> None:
    # 5 rows over 4 ranks: chunks of 2, the last rank holds nothing; one bfloat16 pair of
    # single values may coincide by chance, so it is not compared
    assert shard_copies(torch.ones(5, dtype=torch.bfloat16), 4) == (None, 0, 3)
    assert shard_copies(torch.ones(5), 4)[0].startswith("shards of ranks 0 and 1 (2 rows), 0 and 2 (1 rows)")

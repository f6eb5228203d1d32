"""The gradient-scale comparison (numerics.scale.judge_gradient_scale), its scatter from eager's
roundings against a float64 reference, on gradients built the way data-parallel ranks build
them: each rank's Linear weight gradient from its own micro-batch, the expected gradient
computed by eager from a bfloat16 upstream gradient, "Thunder" from the float32 one, rounding
once (as a fusing executor does), and then reducing in bfloat16 (sum, then divide by the world
size).
No Thunder and no world: the statistic alone, over many draws."""

from __future__ import annotations

import pytest
import torch

from conformance.checks.findings import Findings
from conformance.checks.numerics.scale import judge_gradient_scale, scale_constants
from conformance.checks.record import RankGradients
from conformance.matrix.cells import Cell
from fixtures import patterns

SHAPES = {"fc1.weight": (32, 24), "fc2.weight": (16, 32), "fc2.bias": (16,)}
BF16 = torch.bfloat16
WHAT = "gradient scale at step 4 (AdamW)"


Ranks = tuple[RankGradients, dict[str, torch.Tensor], dict[str, torch.Tensor]]


def _ranks(seed: int, world: int = 2) -> Ranks:
    """(eager's local gradients averaged exactly with their mean magnitude, the same gradients
    computed in float64: the reference, the reduced gradients a conforming implementation
    hands back), by name."""
    g = torch.Generator().manual_seed(seed)
    mean: dict[str, torch.Tensor] = {}
    magnitude: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    reduced: dict[str, torch.Tensor] = {}
    for name, shape in SHAPES.items():
        eager, exact, fused = [], [], []
        for _ in range(world):
            # the upstream gradient as float32 computes it: eager rounds it to bfloat16 before
            # the matmul (one rounding shared along a row of the weight gradient), the fused
            # implementation does not
            upstream = torch.randn(8, shape[0], generator=g)
            if len(shape) == 2:
                x = torch.randn(8, shape[1], generator=g).to(BF16)
                eager.append(upstream.to(BF16).T @ x)  # bfloat16 matmul
                exact.append(upstream.double().T @ x.double())
                fused.append((upstream.T @ x.float()).to(BF16))
            else:
                eager.append(upstream.to(BF16).sum(0))
                exact.append(upstream.double().sum(0))
                fused.append(upstream.sum(0).to(BF16))
        mean[name] = sum(e.double() for e in eager) / world
        magnitude[name] = sum(e.double().abs() for e in eager) / world
        reference[name] = sum(exact) / world
        total = fused[0]
        for f in fused[1:]:
            total = total + f  # rounded in bfloat16 at every addition
        reduced[name] = total / world
    return RankGradients(mean, magnitude), reference, reduced


def _judge(actual: dict[str, torch.Tensor], ranks: Ranks, world: int = 2, what: str = WHAT) -> Findings:
    found = Findings()
    local, reference, _ = ranks
    judge_gradient_scale(found, what, actual, local, reference, BF16, [1.0 / world], world - 1, world)
    return found


@pytest.mark.parametrize("world", [2, 3])
def test_roundings_alone_pass(world: int) -> None:
    for seed in range(40):
        ranks = _ranks(seed, world)
        found = _judge(ranks[2], ranks, world)
        assert not found.failures, (seed, found.failures)


@pytest.mark.parametrize("scale", [1.01, 0.99])
def test_one_percent_fails_once(scale: float) -> None:
    for seed in range(10):
        ranks = _ranks(seed)
        found = _judge({n: (t.float() * scale).to(BF16) for n, t in ranks[2].items()}, ranks)
        # all of them, and each rank's rows: no tensor repeats it
        assert len(found.failures) == 3, found.failures
        assert found.failures[0].startswith("gradient scale at step 4 (AdamW) [all]: Thunder's gradients are ")
        measured = float(found.failures[0].split("gradients are ")[1].split(" x ")[0])
        assert abs(measured - scale) < 1e-3, found.failures[0]


def test_thunders_own_noise_does_not_widen_its_bound() -> None:
    """The scatter comes from eager's roundings: a Thunder 1% off and noisy besides (10% per
    element, which its own residuals would have turned into a bound of about 3%) still fails."""
    g = torch.Generator().manual_seed(7)
    ranks = _ranks(3)
    noise = {n: 1 + 0.1 * torch.randn(t.shape, generator=g) for n, t in ranks[2].items()}
    noisy = {n: (t.float() * 1.01 * noise[n]).to(BF16) for n, t in ranks[2].items()}
    found = _judge(noisy, ranks)
    assert any("[all]" in f for f in found.failures), found.failures


def test_one_tensor_off_is_named() -> None:
    ranks = _ranks(0)
    reduced = ranks[2]
    reduced["fc1.weight"] = (reduced["fc1.weight"].float() * 1.02).to(BF16)
    failures = _judge(reduced, ranks).failures
    assert any("[fc1.weight]" in f for f in failures), failures
    assert not any("[fc2.weight]" in f for f in failures), failures


def test_one_ranks_rows_off_are_named() -> None:
    """A scale on the last rank's shard alone (the rows FSDP gives it) fails that rank's rows."""
    ranks = _ranks(2)
    reduced = ranks[2]
    first = {n: patterns.chunk_rows(len(t), 2) for n, t in reduced.items()}  # rank 0's rows
    off = {n: torch.cat([t[: first[n]], (t[first[n] :].float() * 1.01).to(BF16)]) for n, t in reduced.items()}
    found = _judge(off, ranks, what="gradient scale at step 0 (SGD)")
    assert any("[rank 1's rows]" in f for f in found.failures), found.failures
    assert not any("[rank 0's rows]" in f for f in found.failures), found.failures


def test_what_thunder_got_wrong_is_no_crash() -> None:
    ranks = _ranks(0)
    reduced = ranks[2]
    reduced["fc1.weight"] = torch.full_like(reduced["fc1.weight"], float("nan"))
    reduced["fc2.weight"] = reduced["fc2.weight"][:3]  # a wrong shape
    del reduced["fc2.bias"]
    found = _judge(reduced, ranks)  # the elementwise comparison names these
    assert not found.failures
    assert found.metrics["gradient scale at step 4 (AdamW) |scale| / bound (worst)"] == 0.0


def test_scale_constants_come_from_the_cell() -> None:
    assert scale_constants(Cell("mlp", "real", "jit_fsdp", world_size=3)) == [1 / 3]
    constants = scale_constants(Cell("dropout_head", "real", "jit_fsdp", world_size=4))
    assert constants == [1 / 4, 1 / 0.75]
    # 1/0.75 rounds in bfloat16 to 1.3359375: its rounding is allowed, a scale beyond it is not
    local, reference, reduced = _ranks(1)
    found = Findings()
    rounded = {n: (t.float() * (1.3359375 / (4 / 3))).to(BF16) for n, t in reduced.items()}
    judge_gradient_scale(found, "gradient scale", rounded, local, reference, BF16, constants, 1)
    assert not found.failures, found.failures

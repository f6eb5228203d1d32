"""Numerics' dropout judgement (conformance/checks/numerics/dropout.py) on synthetic masks of
dropout_head's size: true draws pass, and a rate 0.02 off, rows or columns dropped together,
a replayed or alternating mask and two ranks' equal masks each fail."""

from __future__ import annotations

import torch

from conformance.checks.findings import Findings
from conformance.checks.numerics.dropout import judge_dropout

P, STEPS, RANKS, ROWS, COLS = 0.25, 6, 2, 120, 15


def _masks(p: float = P, seed: int = 0) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.rand(ROWS, COLS, generator=gen) >= p for _ in range(RANKS)] for _ in range(STEPS)]


def _failures(masks: list[list[torch.Tensor]]) -> list[str]:
    found = Findings()
    judge_dropout(found, masks, P)
    return found.failures


def test_true_draws_pass() -> None:
    for seed in range(20):
        assert _failures(_masks(seed=seed)) == []


def test_a_rate_two_hundredths_off_fails() -> None:
    for seed in range(5):
        assert any(f.startswith("dropout fraction dropped") for f in _failures(_masks(p=0.27, seed=seed)))


def test_rows_or_columns_dropped_together_fail() -> None:
    rows = [[m[:, :1].expand(ROWS, COLS).clone() for m in ms] for ms in _masks()]
    assert any(f.startswith("dropout masks' rows") for f in _failures(rows))
    cols = [[m[:1].expand(ROWS, COLS).clone() for m in ms] for ms in _masks()]
    assert any(f.startswith("dropout masks' columns") for f in _failures(cols))


def test_replayed_alternating_and_shared_masks_fail() -> None:
    masks = _masks()
    frozen = [masks[0] for _ in range(STEPS)]
    assert any(f.startswith("dropout mask at step 1:") for f in _failures(frozen))
    alternating = [masks[k % 2] for k in range(STEPS)]
    found = _failures(alternating)
    assert any(f.startswith("dropout mask at step 2:") for f in found)
    assert not any(f.startswith("dropout mask at step 1:") for f in found)
    shared = [[ms[0]] * RANKS for ms in masks]
    assert any(f.startswith("dropout masks of ranks 0 and 1 at step 0") for f in _failures(shared))


def test_ranks_seeded_alike_may_share_a_mask() -> None:
    shared = [[ms[0]] * RANKS for ms in _masks()]
    found = Findings()
    judge_dropout(found, shared, P, seeded_apart=False)
    assert found.failures == [] and found.metrics["dropout fraction dropped"]["values"] == STEPS * ROWS * COLS

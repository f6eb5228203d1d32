"""Numerics' judgement of a dropout that is the model's last op, from this rank's outputs."""

from __future__ import annotations

import math

import torch

from conformance.checks.findings import Findings

# how many binomial standard deviations the fraction a dropout dropped may stray from p: a
# false alarm below one in 10^8 cells, and a dropout at half its p still fails
DROPOUT_DEVIATIONS = 6.0


def judge_dropout(found: Findings, outputs: list[torch.Tensor], p: float) -> None:
    """The masks of a dropout that is the model's last op, read from this rank's outputs
    (zero where dropped; the eager models replayed them, so outputs and gradients were
    compared exactly): over the training steps they drop p of the elements, within
    ``DROPOUT_DEVIATIONS`` binomial standard deviations, and no step draws the mask the step
    before it drew (Thunder must draw anew every step, not replay one draw)."""
    masks = [o == 0 for o in outputs]
    n = sum(m.numel() for m in masks)
    if not n:
        return
    dropped = sum(int(m.sum()) for m in masks) / n
    bound = DROPOUT_DEVIATIONS * math.sqrt(p * (1 - p) / n)
    found.metrics["dropout fraction dropped"] = {"measured": dropped, "p": p, "bound": bound}
    with found.expect("dropout fraction dropped"):
        assert abs(dropped - p) <= bound, (
            f"{dropped:.4f} of {n} outputs dropped over {len(masks)} steps, expected p = {p} within {bound:.4f} "
            f"({DROPOUT_DEVIATIONS:g} binomial standard deviations)"
        )
    for k in range(1, len(masks)):
        with found.expect(f"dropout mask at step {k}"):
            same = masks[k].shape == masks[k - 1].shape and torch.equal(masks[k], masks[k - 1])
            assert not same, f"the mask of step {k - 1} again: the dropout did not draw anew"

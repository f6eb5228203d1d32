"""Replaying in eager PyTorch the dropout masks the Thunder module drew.

A dropout mask is a random draw: Thunder's (a uniform sample compared with 1 - p) and eager's
(a Bernoulli sample) come from different streams, so no seed makes them agree. Where the
dropout is the model's last op (``ModelFixture.output_dropout``), the mask shows in the
Thunder module's output, zero exactly where it dropped; the eager models then apply that
mask, scaled as ``nn.Dropout`` scales (``mask / (1 - p)`` in the input's dtype, then a
product), so that outputs and gradients compare as exactly as without dropout. What the
masks themselves must be (how many they drop, a new one every step) only statistics can
judge: the numerics area does, from the outputs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class ReplayedDropout(nn.Module):
    """Eager's stand-in for the output dropout: the mask drawn for the rank whose micro-batch
    runs (``rank``, set by ``PerRank``); with no masks set (outside a training step: an
    input's shape, an eager peak before the first step) it drops nothing, as in eval mode."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.masks: list[torch.Tensor] | None = None
        self.rank = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.masks is None:
            return x
        mask = self.masks[self.rank].to(x.device)
        if mask.shape != x.shape:
            # Thunder's output had another shape than eager's: nothing to replay; the output
            # comparison names the wrong shape (a finding, not the end of the cell)
            return x
        return x * (mask.to(x.dtype) / (1 - self.p))


def replace_output_dropout(module: nn.Module, p: float | None) -> None:
    """Swap the model's ``nn.Dropout`` of probability ``p`` for a ``ReplayedDropout``, in place."""
    if p is None:
        return
    for name, child in list(module.named_modules()):
        if isinstance(child, nn.Dropout) and child.p == p:
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner), leaf, ReplayedDropout(p))


def replayed(*modules: nn.Module | None) -> list[ReplayedDropout]:
    return [m for module in modules if module is not None for m in module.modules() if isinstance(m, ReplayedDropout)]


def point_at(module: nn.Module, rank: int) -> None:
    """Let ``module``'s replayed dropouts apply rank ``rank``'s mask."""
    for m in replayed(module):
        m.rank = rank


def drawn_masks(out: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's mask, from its Thunder module's output: kept where nonzero. The ranks'
    outputs have one shape (their micro-batches do), so one all-gather carries them."""
    mine = (out.detach() != 0).to(torch.uint8).contiguous()
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [m.bool().cpu() for m in every]

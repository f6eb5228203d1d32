"""Eager PyTorch beside a scenario: a copy of the eager model holding the Thunder module's own
gathered weights (and below float32 its float32 twin), the inputs and cotangents of one
global batch, and eager's gradients of the ranks' averaged loss."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from conformance.checks.record import RankGradients
from conformance.rank.build import EagerModel, Recipe
from conformance.rank.eager import EagerPass, eager_gradients, holding
from conformance.rank.mixed import float32_twin
from conformance.rank.train import STEPS, generator
from fixtures.optimizers import OPTIMIZERS

Tensors = dict[str, torch.Tensor]

# the first input step after training: inputs neither model has seen
AFTER_TRAINING = STEPS * len(OPTIMIZERS)


@dataclasses.dataclass
class Eager:
    """Eager PyTorch holding the Thunder module's weights as they are now."""

    module: nn.Module
    twin: nn.Module | None  # its float32 twin, below float32

    @classmethod
    def beside(cls, recipe: Recipe, eager_model: EagerModel, tm: Any) -> Eager:
        module = holding(eager_model.module, eager_model.gather(tm))
        twin = float32_twin(module, recipe.compute_dtype)
        return cls(module, twin)


@dataclasses.dataclass
class Batch:
    """One global batch: every rank's input and the cotangent its output is weighted by."""

    inputs: list[torch.Tensor]
    cotangents: list[torch.Tensor]

    @classmethod
    def draw(
        cls,
        make: Callable[[torch.Generator, torch.dtype], torch.Tensor],
        recipe: Recipe,
        eager: nn.Module,
        step: int,
        world: int,
    ) -> Batch:
        """Inputs of step ``step`` from ``make``, cotangents of the shape eager's output has
        (the same generators as training's, so a scenario's batch is as reproducible)."""
        device, dtype = recipe.device, recipe.dtype
        inputs = [make(generator(step, r), dtype).to(device) for r in range(world)]
        with torch.no_grad():
            shapes = [eager(x).shape for x in inputs]
        compute = recipe.compute_dtype  # the output's
        cotangents = [torch.randn(s, generator=generator(step, r, 7)).to(device, compute) for r, s in enumerate(shapes)]
        return cls(inputs, cotangents)


def batch_gradients(module: nn.Module, batch: Batch, float32: bool = False) -> EagerPass:
    """``eager_gradients`` on ``batch``."""
    return eager_gradients(module, batch.inputs, batch.cotangents, float32=float32)


def summed(parts: list[Tensors]) -> Tensors:
    """Per name, the sum of the tensors of ``parts`` (every part names the same tensors)."""
    return {n: sum((p[n] for p in parts[1:]), parts[0][n].clone()) for n in parts[0]}


def scaled(part: Tensors, factor: float) -> Tensors:
    return {n: t * factor for n, t in part.items()}


def weighted(parts: list[Tensors], factors: list[float]) -> Tensors:
    """Per name, the sum of ``parts`` each times its factor (a factor of 0 leaves a part out)."""
    return summed([scaled(p, f) for p, f in zip(parts, factors, strict=True) if f])


def combined(parts: list[RankGradients], factors: list[float] | None = None) -> RankGradients:
    """Per name, the ranks' gradients of several batches summed (each times its factor):
    their means summed, their magnitudes summed (times |factor|)."""
    factors = factors or [1.0] * len(parts)
    return RankGradients(
        weighted([p.mean for p in parts], factors), weighted([p.magnitude for p in parts], [abs(f) for f in factors])
    )

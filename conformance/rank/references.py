"""The references a training step runs beside the Thunder module (conformance/rank/train.py),
one class each: what it is, how it is built (which model, which weights, which input, which
dtype) and what the checks compare it with. Each step records their results by name
(``StepRecord.eager``, ``twin``, ``twin_at_thunder``, ``local_at_thunder``,
``float64_at_thunder``).

The step calls them in a fixed order, which keeps its results reproducible: a reference at
the Thunder module's weights copies every rank's buffers before eager's forward of the step
updates them, and the twin at those weights runs before the twin's own forward.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from conformance.checks.record import RankGradients, ReferenceStep, TrainedStep
from conformance.rank.buffers import PerRank
from conformance.rank.eager import (
    Tensors,
    eager_gradients,
    eager_peaks,
    float32_input,
    float64_gradients,
    holding,
    mean_loss,
    rank_gradients,
)
from conformance.rank.gather import cpu_copies, snapshot
from conformance.rank.held import copies_in_eager


@dataclasses.dataclass
class Trained:
    """A reference model that trains in lockstep with the Thunder module on the whole global
    batch: every rank's micro-batch, each with that rank's buffers (``buffers``), the ranks'
    losses averaged, as FSDP averages gradients. Its optimizer steps beside the Thunder
    module's (``train._Lockstep.optimizers``)."""

    module: nn.Module
    buffers: PerRank  # every rank's buffers (conformance/rank/buffers.py)

    @classmethod
    def of(cls, module: nn.Module, world: int) -> Trained:
        """``module`` with one set of buffers per rank of ``world``."""
        return cls(module, PerRank(module, world))

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        """An input as this model takes it."""
        return x

    def _cotangent(self, c: torch.Tensor) -> torch.Tensor:
        """A cotangent as this model takes it."""
        return c

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every rank's output, each rank's forward with that rank's buffers (kept)."""
        return self.buffers.forward([self._input(x) for x in inputs])

    def backward(self, outputs: list[torch.Tensor], cotangents: list[torch.Tensor]) -> None:
        """Accumulate the gradients of the ranks' averaged loss."""
        mean_loss(outputs, [self._cotangent(c) for c in cotangents]).backward()

    def peaks(self, rank: int, x: torch.Tensor, cotangent: torch.Tensor, device: torch.device) -> dict[str, int]:
        """Its forward and backward peaks on rank ``rank``'s input, leaving no trace on its
        buffers or gradients (the measured step's)."""
        with self.buffers.rank(rank, keep=False):
            return eager_peaks(self.module, self._input(x), self._cotangent(cotangent), device)

    def parameter_copies(self, rank: int, x: torch.Tensor, device: torch.device) -> dict[str, int]:
        """The parameters its forward on rank ``rank``'s input leaves a copy of alive
        (``held.copies_in_eager``), leaving no trace on its buffers."""
        with self.buffers.rank(rank, keep=False):
            return copies_in_eager(self.module, self._input(x), device)

    def gradients(self) -> Tensors:
        """Its accumulated gradients, by name (CPU copies)."""
        return snapshot(self.module, grads=True)

    def hold(self, rank: int) -> None:
        """Leave the model holding rank ``rank``'s buffers, the ones the record reads."""
        self.buffers.hold(rank)

    def result(self, outputs: list[torch.Tensor], grads: Tensors, rank: int) -> TrainedStep:
        """Its side of the step: ``rank``'s output, ``grads`` (taken before its optimizer
        stepped) and the buffers it holds (after ``hold(rank)``)."""
        return TrainedStep(
            output=outputs[rank].detach().cpu(), grads=grads, buffers=cpu_copies(self.module.named_buffers())
        )


class Eager(Trained):
    """Eager PyTorch: the eager model (conformance/rank/build.build_eager_model: the kit's
    seed, the cell's dtype, real tensors on the rank's device; under module init it adopted
    the Thunder module's initial weights) trained on every rank's micro-batch.

    Compared with (conformance/checks/numerics/steps.py): the Thunder module's output on this
    rank, its gathered gradients, its parameters after the step and its buffers, at every
    step: in float32 at fixed tolerances, below float32 within a factor of eager's own
    distance from the twin."""


class Twin(Trained):
    """The float32 twin (below float32 only): a copy of the eager model as built, in float32
    (``train.train`` makes it before anything is measured), trained in lockstep beside it on
    the same inputs and cotangents, upcast (token ids stay integers).

    Compared with: eager's distance from it sets every tolerance below float32
    (conformance/checks/numerics/tolerances.py: per element and as a whole); Thunder's update
    of each step is held against its update (``numerics.propagation``), and what an optimizer
    makes of gradients off as far as eager's is computed from its gradients."""

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        return float32_input(x)

    def _cotangent(self, c: torch.Tensor) -> torch.Tensor:
        return c.float()


@dataclasses.dataclass
class TwinAtThunder:
    """The float32 twin at the Thunder module's weights (below float32 only): a copy of the
    twin holding the weights the Thunder module holds as the step starts (upcast), run on
    every rank's input and cotangent (upcast) with copies of the twin's buffers of each rank
    as they stand before the twin's own forward of the step. It does not train.

    Compared with: the twin's own output and gradients (at its own weights): their distance
    is what the parameters' drift so far, which the parameters' comparison allows, makes of
    this step's, allowed on top of the output's and the gradients' tolerances
    (``numerics.tolerances.drift_effect``); eager's per-rank gradients (``LocalAtThunder``)
    are measured against it (``numerics.tolerances.Local``), and it is the gradient scale's
    reference one precision up (``numerics.scale.judge_gradient_scale``)."""

    module: nn.Module
    buffers: PerRank

    @classmethod
    def taken(cls, twin: Twin, weights: Tensors) -> TwinAtThunder:
        module = holding(twin.module, weights)
        return cls(module, twin.buffers.clones_for(module))

    def run(self, inputs: list[torch.Tensor], cotangents: list[torch.Tensor], rank: int) -> ReferenceStep:
        """Its output on ``rank``'s input and its gradients of the ranks' averaged loss."""
        passed = eager_gradients(self.module, inputs, cotangents, self.buffers, float32=True)
        return ReferenceStep(output=passed.outputs[rank], grads=passed.grads)


@dataclasses.dataclass
class LocalAtThunder:
    """Eager at the Thunder module's weights, each rank alone: a copy of the eager model
    holding exactly the weights the Thunder module holds as the step starts (the cell's
    dtype), with copies of every rank's buffers taken before eager's forward of the step
    updates them; on every rank's input and cotangent, each rank's gradient of its own loss
    alone (``eager.rank_gradients``: what a data-parallel rank hands its reduction), their
    mean and mean magnitude in float64.

    Compared with: Thunder's reduced gradients, for their scale
    (``numerics.scale.judge_gradient_scale``, in float32 too, whose fixed elementwise
    tolerance hides a scale of all gradients); below float32 its distance from the twin at
    the same weights counts as eager's own error, and its magnitudes bound the reduction's
    roundings (``numerics.tolerances.Local``)."""

    module: nn.Module
    buffers: PerRank

    @classmethod
    def taken(cls, eager: Eager, weights: Tensors) -> LocalAtThunder:
        """Take it before eager's forward of the step updates eager's buffers."""
        module = holding(eager.module, weights)
        return cls(module, eager.buffers.clones_for(module))

    def run(self, inputs: list[torch.Tensor], cotangents: list[torch.Tensor]) -> RankGradients:
        return rank_gradients(self.module, inputs, cotangents, self.buffers)


@dataclasses.dataclass
class Float64AtThunder:
    """Eager in float64 at the Thunder module's weights (float32 cells only): the model of
    ``LocalAtThunder`` (the Thunder module's weights as the step starts), copied and cast to
    float64, with every rank's buffers as they stood before eager's forward of the step
    (cast); on every rank's input and cotangent (cast), the gradients of the ranks' averaged
    loss. What the float32 twin at those weights is below float32.

    Compared with: eager's per-rank gradients (``LocalAtThunder``): what float32's roundings
    did to eager's own, the scatter that bounds Thunder's gradient scale
    (``numerics.scale.judge_gradient_scale``'s reference)."""

    module: nn.Module  # shared with LocalAtThunder's: float64_gradients runs a float64 copy
    buffers: PerRank

    @classmethod
    def taken(cls, eager: Eager, local: LocalAtThunder) -> Float64AtThunder:
        """Take it before eager's forward of the step updates eager's buffers."""
        return cls(local.module, eager.buffers.clones_for(local.module))

    def run(self, inputs: list[torch.Tensor], cotangents: list[torch.Tensor], rank: int) -> ReferenceStep:
        """Its output on ``rank``'s input and its gradients of the ranks' averaged loss, in float64."""
        passed = float64_gradients(self.module, inputs, cotangents, self.buffers)
        return ReferenceStep(output=passed.outputs[rank], grads=passed.grads)

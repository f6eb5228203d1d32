"""Training a cell beside eager PyTorch: the Thunder module on this rank's micro-batch, the
eager reference on every rank's (the ranks' losses averaged, as FSDP averages gradients)
and, below float32, a float32 twin of the reference in lockstep.

The second step is the measured one (the first compiles): its forward, backward and
optimizer step are measured, what its forward leaves alive and what the autograd node
saves are recorded, and eager PyTorch's own peaks for the same input are taken beside them.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from conformance.checks.record import ParametersAfter, SavedTensor, StepRecord
from conformance.rank.build import SEED, Recipe, Reference
from conformance.rank.gather import gather, snapshot
from conformance.rank.measure import measure

STEPS = 3  # per optimizer: SGD, then AdamW
# Small steps: trajectories that jump far amplify rounding differences chaotically and would
# turn any tolerance into a guess.
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1),
    # eps above the rounding noise of parameters whose true gradient is zero (an attention
    # key bias): Adam would normalize that noise into full-size steps
    "AdamW": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, eps=1e-6),
}
MEASURED_STEP = 1  # the first step compiles; the second shows the steady state


@dataclasses.dataclass
class Training:
    first_step: StepRecord | None = None  # set by step 0
    after: dict[str, ParametersAfter] = dataclasses.field(default_factory=dict)  # optimizer -> after its steps
    peaks: dict[str, int] = dataclasses.field(default_factory=dict)  # forward, backward, step -> peak bytes
    eager_peaks: dict[str, int] = dataclasses.field(default_factory=dict)  # forward, backward of eager
    alive_after_forward: int = 0  # bytes the measured forward allocated and left alive
    saved: list[SavedTensor | None] | None = None  # held by the autograd node after the measured forward
    timings: dict[str, float] = dataclasses.field(default_factory=dict)  # step<i>_s -> seconds


def generator(*key: int) -> torch.Generator:
    """A generator seeded from the kit's seed and ``key`` (a step, a rank, ...)."""
    seed = SEED
    for k in key:
        seed = seed * 1_000_003 + k
    return torch.Generator().manual_seed(seed % (2**63))


@dataclasses.dataclass
class _Lockstep:
    """The models that train in lockstep on one global batch, and what they record."""

    recipe: Recipe
    reference: Reference
    thunder: Any
    golden: nn.Module | None  # float32 twin of the reference below float32
    rank: int
    world: int
    training: Training = dataclasses.field(default_factory=Training)

    def optimizers(self, make: Callable[[Any], torch.optim.Optimizer]) -> list[torch.optim.Optimizer | None]:
        """One per model, the Thunder module's first."""
        thunder, reference = make(self.thunder.parameters()), make(self.reference.module.parameters())
        return [thunder, reference, make(self.golden.parameters()) if self.golden is not None else None]

    def step(self, step: int, optimizers: list[torch.optim.Optimizer | None]) -> None:
        """One step of every model; step 0 keeps outputs and gradients, the measured step its memory."""
        device, dtype, tm, rank = self.recipe.device, self.recipe.dtype, self.thunder, self.rank
        reference, golden, training = self.reference.module, self.golden, self.training
        measured = step == MEASURED_STEP
        inputs = [self.recipe.fixture.make_input(generator(step, r), dtype).to(device) for r in range(self.world)]
        with measure(device, settle=measured) as forward:
            out = tm(inputs[rank])
        if measured:
            training.saved = _saved_tensors(out)
        ref_outs = [reference(x) for x in inputs]
        cotangents = [
            torch.randn(o.shape, generator=generator(step, r, 7)).to(device, dtype) for r, o in enumerate(ref_outs)
        ]
        loss = (out * cotangents[rank]).mean()
        with measure(device) as backward:
            loss.backward()
        if measured:
            training.eager_peaks.update(_eager_peaks(reference, inputs[rank], cotangents[rank], device))
        # FSDP averages gradients over ranks: the reference loss is the mean of the ranks' losses.
        _mean_loss(ref_outs, cotangents).backward()
        golden_outs = None
        if golden is not None:
            golden_outs = [golden(x if not x.is_floating_point() else x.float()) for x in inputs]
            _mean_loss(golden_outs, [c.float() for c in cotangents]).backward()
        if step == 0:
            training.first_step = StepRecord(
                output=out.detach().cpu(),
                reference_output=ref_outs[rank].detach().cpu(),
                grads=gather(tm, self.reference.shapes, grads=True),
                reference_grads=snapshot(reference, grads=True),
                golden_output=None if golden_outs is None else golden_outs[rank].detach().cpu(),
                golden_grads=None if golden is None else snapshot(golden, grads=True),
            )
        thunder_opt = optimizers[0]
        with measure(device) as optimizer_step:
            thunder_opt.step()
        for o in optimizers:
            if o is not None:
                if o is not thunder_opt:
                    o.step()
                o.zero_grad(set_to_none=True)
        if measured:
            training.peaks.update(forward=forward.peak, backward=backward.peak, step=optimizer_step.peak)
            training.alive_after_forward = forward.alive


def train(recipe: Recipe, reference: Reference, tm: Any, rank: int, world: int) -> Training:
    """STEPS steps of each optimizer in turn, on fresh optimizers, all models in lockstep."""
    # Below float32, eager's own rounding sets the tolerance: a float32 twin trains in lockstep
    # and Thunder may stray from it at most a stated factor further than eager does.
    golden = copy.deepcopy(reference.module).float() if recipe.dtype != torch.float32 else None
    lockstep = _Lockstep(recipe, reference, tm, golden, rank, world)
    training = lockstep.training
    step = 0
    for opt_name, make_opt in OPTIMIZERS.items():
        optimizers = lockstep.optimizers(make_opt)
        for _ in range(STEPS):
            began = time.perf_counter()
            lockstep.step(step, optimizers)
            training.timings[f"step{step}_s"] = time.perf_counter() - began
            step += 1
        training.after[opt_name] = ParametersAfter(
            thunder=gather(tm, reference.shapes),
            reference=snapshot(reference.module),
            golden=snapshot(golden) if golden is not None else None,
        )
    return training


def _saved_tensors(out: torch.Tensor) -> list[SavedTensor | None] | None:
    """The tensors Thunder's autograd node holds for backward (None: no such node)."""
    from transforms.offload import is_offloaded

    node = out.grad_fn
    if node is None or not hasattr(node, "saved_tensors"):
        return None
    return [
        SavedTensor(is_offloaded(t), str(t.device), t.untyped_storage().nbytes()) if t is not None else None
        for t in node.saved_tensors
    ]


def _eager_peaks(
    reference: nn.Module, x: torch.Tensor, cotangent: torch.Tensor, device: torch.device
) -> dict[str, int]:
    """Eager's peaks for this rank's input; gradients are returned, not accumulated, so the
    reference's own training is untouched."""
    with measure(device) as forward:
        out = reference(x)
    loss = (out * cotangent).mean()
    with measure(device) as backward:
        torch.autograd.grad(loss, [p for p in reference.parameters() if p.requires_grad])
    return {"forward": forward.peak, "backward": backward.peak}


def _mean_loss(outputs: list[torch.Tensor], cotangents: list[torch.Tensor]) -> torch.Tensor:
    return sum((o * c).mean() for o, c in zip(outputs, cotangents, strict=True)) / len(outputs)

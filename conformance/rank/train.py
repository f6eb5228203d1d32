"""Training a cell beside eager PyTorch: the Thunder module on this rank's micro-batch, the
eager model on every rank's (the ranks' losses averaged, as FSDP averages gradients)
and, below float32, a float32 twin of the eager model in lockstep; beside them, each step
runs the references at the Thunder module's weights (conformance/rank/references.py).

The second step is the measured one (the first compiles): its forward, backward and
optimizer step are measured, what its forward leaves alive and what the autograd node
saves are recorded, and eager PyTorch's own peaks for the same input are taken beside them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from conformance.checks.findings import ThunderReturnedWrong
from conformance.checks.record import (
    MEASURED_STEP,
    ForwardHeld,
    LossRegion,
    ParametersAfter,
    Replicas,
    SavedTensor,
    StepRecord,
)
from conformance.checks.storages import distinct_storages
from conformance.checks.traces import final_traces
from conformance.rank import held, progress
from conformance.rank.build import SEED, EagerModel, Recipe
from conformance.rank.clock import thunder_call
from conformance.rank.dropout import drawn_masks, replayed
from conformance.rank.eager import loss, loss_region, unweighable
from conformance.rank.gather import apart_from_rank0, cpu_copies, snapshot
from conformance.rank.measure import Ledger, measure, unmeasurable
from conformance.rank.mixed import float32_twin
from conformance.rank.process_group import calls_for, counting
from conformance.rank.references import Eager, Float64AtThunder, LocalAtThunder, Twin, TwinAtThunder
from fixtures import patterns
from fixtures.optimizers import OPTIMIZERS

STEPS = 3  # per optimizer (fixtures/optimizers.py): SGD, then AdamW


@dataclasses.dataclass
class Training:
    steps: list[StepRecord] = dataclasses.field(default_factory=list)  # every step, in order
    peaks: dict[str, int] = dataclasses.field(default_factory=dict)  # forward, backward, step -> peak bytes
    eager_peaks: dict[str, int] = dataclasses.field(default_factory=dict)  # forward, backward of eager
    alive_after_forward: int = 0  # bytes the measured forward allocated and left alive
    held_before_forward: int = 0  # bytes the Thunder side held when the measured forward began
    held_after_backward: list[int] = dataclasses.field(default_factory=list)  # the ledger after each backward
    held_after_step: list[int] = dataclasses.field(default_factory=list)  # ... after each step (gradients zeroed)
    # each optimizer step's peak over what was held before it, and the same optimizer's on
    # eager tensors of the shard shapes
    step_peaks: list[int] = dataclasses.field(default_factory=list)
    eager_step_peaks: list[int] = dataclasses.field(default_factory=list)
    saved: list[SavedTensor | None] | None = None  # held by the autograd node after the measured forward
    forward_held: ForwardHeld | None = None  # ... storage by storage, under PyTorch's parallelism
    loss: LossRegion | None = None  # around the measured backward
    timings: dict[str, float] = dataclasses.field(default_factory=dict)  # step<i>_s -> seconds
    # the Thunder module's optimizer of the last stage (AdamW), with its state: a scenario
    # steps on with it (``resume`` checkpoints it)
    optimizer: torch.optim.Optimizer | None = None


def generator(*key: int) -> torch.Generator:
    """A generator seeded from the kit's seed and ``key`` (a step, a rank, ...)."""
    seed = SEED
    for k in key:
        seed = seed * 1_000_003 + k
    return torch.Generator().manual_seed(seed % (2**63))


@dataclasses.dataclass
class _Lockstep:
    """The models that train in lockstep on one global batch, and what they record.

    Only the Thunder module's work runs inside the ledger's phases: the eager model's and the
    twin's steps in between are the kit's, not the rank's memory under test.
    """

    recipe: Recipe
    eager_model: EagerModel
    thunder: Any
    twin_module: nn.Module | None  # float32 twin of the eager model below float32
    rank: int
    world: int
    training: Training = dataclasses.field(default_factory=Training)

    def __post_init__(self) -> None:
        recipe = self.recipe
        why = unmeasurable(recipe.device, recipe.executors)
        # FSDP2 frees and re-allocates its unsharded parameters by resizing their storages
        self.torch_parallel = recipe.composition.parallelism == "torch"
        self.ledger = Ledger(recipe.device, measured=why is None, resizes=self.torch_parallel)
        # one optimizer-state twin per trainable storage, of the shape this rank holds
        shard_ranks = self.eager_model.shard_ranks
        held_world = 1 if self.eager_model.replicated else len(shard_ranks) if shard_ranks else self.world
        self.shard_twins = _shard_twins(self.eager_model.module, held_world, self.recipe.device)
        # the eager models run every rank's micro-batch, each with that rank's buffers
        self.eager = Eager.of(self.eager_model.module, self.world)
        self.twin = Twin.of(self.twin_module, self.world) if self.twin_module is not None else None
        self.weights = self.eager_model.gather(self.thunder)  # the Thunder module's, as the next step starts
        self.replays = replayed(self.eager_model.module, self.twin_module)

    def optimizers(self, make: Callable[[Any], torch.optim.Optimizer]) -> list[torch.optim.Optimizer | None]:
        """One per model, the Thunder module's first, the shard twins' last."""
        thunder, eager_model = make(self.thunder.parameters()), make(self.eager.module.parameters())
        twin = make(self.twin.module.parameters()) if self.twin is not None else None
        return [thunder, eager_model, twin, make(self.shard_twins)]

    def step(self, step: int, optimizer: str, optimizers: list[torch.optim.Optimizer | None]) -> None:
        """One step of every model, recorded; the measured step also records its memory."""
        device, dtype, tm, rank = self.recipe.device, self.recipe.dtype, self.thunder, self.rank
        compute = self.recipe.compute_dtype  # the output's, and its cotangent's
        eager, twin, training, ledger = self.eager, self.twin, self.training, self.ledger
        measured = step == MEASURED_STEP
        inputs = [self.recipe.fixture.make_input(generator(step, r), dtype).to(device) for r in range(self.world)]
        held_before = ledger.read()
        calls = calls_for(self.recipe.composition)
        # under PyTorch's parallelism no single trace says what the forward keeps: its storages
        # are read one by one against what holds them (held.py)
        storages_before = held.before_forward(ledger) if measured and self.torch_parallel else None
        with ledger.phase(settle=measured) as forward, thunder_call("forward"), counting(calls, "forward"):
            out = tm(inputs[rank])
        masks = None
        if self.replays:  # the eager models apply the masks the ranks' Thunder modules drew
            masks = drawn_masks(out)
            for replay in self.replays:
                replay.masks = masks
        if measured:
            training.saved = _saved_tensors(out)
            training.forward_held = held.forward_held(
                out, tm.parameters(), ledger, storages_before, self.weights, compute
            )
            if training.forward_held is not None:
                training.forward_held.eager_copies = eager.parameter_copies(rank, inputs[rank], device)
        # the references at the Thunder module's weights copy every rank's buffers as they stand
        # now, before eager's forward of this step updates them
        local = LocalAtThunder.taken(eager, self.weights)
        float64 = Float64AtThunder.taken(eager, local) if compute == torch.float32 else None
        eager_outs = eager.forward(inputs)
        cotangents = [
            torch.randn(o.shape, generator=generator(step, r, 7)).to(device, compute) for r, o in enumerate(eager_outs)
        ]
        if (wrong := unweighable(out, eager_outs[rank])) is not None:
            raise ThunderReturnedWrong(f"step {step}: the Thunder module's output {wrong}")
        output = out.detach().clone().cpu()
        if measured:
            training.loss = loss_region(out, cotangents[rank], device)
        with ledger.phase() as backward, thunder_call("backward"), counting(calls, "backward"):
            rank_loss = loss(out, cotangents[rank])
            rank_loss.backward()
            del out, rank_loss  # the kit's last references to the forward's result
        training.held_after_backward.append(ledger.read())
        backward_trace = final_traces(tm).backward  # the one Thunder ran last
        if measured:
            training.eager_peaks.update(eager.peaks(rank, inputs[rank], cotangents[rank], device))
            if twin is not None:  # the float32 twin's, below float32
                twin_peaks = twin.peaks(rank, inputs[rank], cotangents[rank], device)
                training.eager_peaks.update({f"float32 {k}": v for k, v in twin_peaks.items()})
        # FSDP averages gradients over ranks: the eager loss is the mean of the ranks' losses.
        eager.backward(eager_outs, cotangents)
        twin_outs = twin_at_thunder = None
        if twin is not None:
            # at the Thunder module's weights before the twin's forward of this step updates its buffers
            twin_at_thunder = TwinAtThunder.taken(twin, self.weights).run(inputs, cotangents, rank)
            twin_outs = twin.forward(inputs)
            twin.backward(twin_outs, cotangents)
        local_at_thunder = local.run(inputs, cotangents)
        float64_at_thunder = None if float64 is None else float64.run(inputs, cotangents, rank)
        grads = self.eager_model.gather(tm, grads=True)
        eager_grads = eager.gradients()
        twin_grads = None if twin is None else twin.gradients()
        thunder_opt = optimizers[0]
        held_before_step = ledger.read()
        with ledger.phase() as optimizer_step, thunder_call("optimizer step"), counting(calls, "optimizer step"):
            thunder_opt.step()
        with measure(device) as twin_step:
            optimizers[-1].step()
        training.step_peaks.append(optimizer_step.peak - held_before_step)
        training.eager_step_peaks.append(twin_step.peak)
        for o in optimizers[1:-1]:
            if o is not None:
                o.step()
                o.zero_grad(set_to_none=True)
        with ledger.phase(), thunder_call("zero_grad"):
            thunder_opt.zero_grad(set_to_none=True)
        training.held_after_step.append(ledger.read(thorough=True))
        eager.hold(rank)
        if twin is not None:
            twin.hold(rank)
        self.weights = self.eager_model.gather(tm)
        # under DDP every rank steps its own whole replica: the same averaged gradients and the
        # same optimizer must leave them identical, bit for bit
        replicas = None
        if self.eager_model.replicated:
            replicas = Replicas(apart_from_rank0(grads), apart_from_rank0(self.weights))
        training.steps.append(
            StepRecord(
                optimizer=optimizer,
                output=output,
                grads=grads,
                eager=eager.result(eager_outs, eager_grads, rank),
                after=ParametersAfter(
                    thunder=self.weights,
                    eager_model=snapshot(eager.module),
                    twin=snapshot(twin.module) if twin is not None else None,
                ),
                twin=None if twin is None else twin.result(twin_outs, twin_grads, rank),
                twin_at_thunder=twin_at_thunder,
                local_at_thunder=local_at_thunder,
                float64_at_thunder=float64_at_thunder,
                buffers=cpu_copies(tm.named_buffers()),
                replicas=replicas,
                backward_trace=backward_trace,
                dropout_masks=masks,
                issued=calls,
            )
        )
        if measured:
            training.peaks.update(forward=forward.peak, backward=backward.peak, step=optimizer_step.peak)
            training.alive_after_forward = forward.alive - held_before
            training.held_before_forward = held_before


def train(recipe: Recipe, eager_model: EagerModel, tm: Any, rank: int, world: int) -> Training:
    """STEPS steps of each optimizer in turn, on fresh optimizers, all models in lockstep."""
    # Below float32, eager's own rounding sets the tolerance: a float32 twin trains in lockstep
    # and Thunder may stray from it at most a stated factor further than eager does.
    twin = float32_twin(eager_model.module, recipe.compute_dtype)
    lockstep = _Lockstep(recipe, eager_model, tm, twin, rank, world)
    training = lockstep.training
    step = 0
    # The full collection before each reading of what a step left held walks only what this
    # cell made: the rank loop froze what the process held before (conformance/world/rankloop.py).
    for opt_name, optimizer in OPTIMIZERS.items():
        optimizers = lockstep.optimizers(optimizer.make)
        training.optimizer = optimizers[0]
        for _ in range(STEPS):
            began = time.perf_counter()
            with progress.phase(f"step {step} ({opt_name})"):
                lockstep.step(step, opt_name, optimizers)
            training.timings[f"step{step}_s"] = time.perf_counter() - began
            step += 1
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


def _shard_twins(module: nn.Module, world: int, device: torch.device) -> list[torch.Tensor]:
    """Eager tensors of the shard shapes the model implies (dim 0 padded to the world size
    and split), one per trainable storage, with zero gradients: for an optimizer to step
    beside the Thunder module's, so that what the optimizer itself allocates is measured."""
    twins = []
    for p in distinct_storages(module, trainable_only=True).values():
        shape = (patterns.chunk_rows(p.shape[0], world), *p.shape[1:]) if p.dim() else ()
        t = torch.zeros(shape, dtype=p.dtype, device=device, requires_grad=True)
        t.grad = torch.zeros_like(t)
        twins.append(t)
    return twins

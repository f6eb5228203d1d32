"""A cell of tensor parallelism on a rank (parallelism ``tensor``: fixtures/tensor_parallel.py).

Every rank builds eager's whole model from one seed, and two copies of it: one parallelized by
the model's plan and compiled with Thunder (the model under test), one parallelized alike and
left eager (eager tensor parallelism). Every rank is handed the same whole batch. ``inference``
runs one forward under ``torch.no_grad``; ``train`` runs STEPS SGD steps of all three in
lockstep. What the model under test issues at the process group is counted by phase; eager
tensor parallelism runs on the same group outside the counting. What each planned Linear is
called with comes from forward hooks on eager's whole model, never from the model under test.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from conformance.checks.findings import CellResult, ThunderReturnedWrong, judged
from conformance.checks.record import (
    Issued,
    LayerCall,
    Placed,
    PlannedLayer,
    TensorParallelRecord,
    TensorParallelStep,
)
from conformance.checks.registry import AREAS, applies
from conformance.matrix.cells import Cell
from conformance.rank import clock, measure, progress, reached
from conformance.rank.build import SEED, Unsupported, recipe
from conformance.rank.clock import thunder_call
from conformance.rank.eager import loss, unweighable
from conformance.rank.gather import cpu_copy, rank_device
from conformance.rank.process_group import counted_group, counting
from conformance.rank.train import generator
from fixtures import tensor_parallel
from fixtures.compositions import Setup
from fixtures.optimizers import OPTIMIZERS
from fixtures.options import INFERENCE

STEPS = 3  # SGD steps of a training cell
_COTANGENT_KEY = 7  # the generator key of each step's cotangent (its input's: the step alone)


def run_tensor_parallel(cell: Cell, declared: frozenset[str] = frozenset()) -> CellResult:
    """Every applicable area's findings of a tensor-parallel cell on this rank."""
    areas = [area for name, area in AREAS.items() if applies(cell, name)]
    try:
        run = drive(cell, declared)
    except Unsupported as exc:
        return CellResult(unsupported=str(exc))
    progress.at("checks")
    return CellResult({area.name: judged(area.tensor_parallel, run) for area in areas}, run.timings)


def drive(cell: Cell, declared: frozenset[str] = frozenset()) -> TensorParallelRecord:
    rank, world = dist.get_rank(), dist.get_world_size()
    clock.restart()
    assert world == cell.world_size, f"cell wants {cell.world_size} ranks, the world has {world}"
    parts = recipe(cell, rank_device())
    plan = parts.fixture.tp_plan
    progress.at("building the eager model")
    torch.manual_seed(SEED)  # the same weights on every rank: tensor parallelism splits them
    with torch.device(parts.device):
        eager = parts.make().to(parts.dtype)
    layers = [PlannedLayer(p.name, p.style, []) for p in tensor_parallel.planned(eager, plan)]
    progress.at("setup")
    group = counted_group()
    began = time.perf_counter()
    how = Setup(parts.device, None, {}, [], parts.executors.jit_options(), process_group=group, tp_plan=plan)
    with thunder_call("parallelize and compile"):
        under_test = parts.composition.build(copy.deepcopy(eager), how)
    setup_s = time.perf_counter() - began
    # before eager tensor parallelism exists: the kit's own then is eager's model and the mesh
    kit = measure.pointers(*eager.parameters(), *eager.buffers(), *under_test.bookkeeping())
    alive_after_setup = measure.census(parts.device, kit).nbytes
    eager_tp = tensor_parallel.eager_tp(copy.deepcopy(eager), under_test.mesh, plan)
    placements = {n: _placed(p) for n, p in under_test.named_parameters()}
    breaks = reached.graph_breaks()
    steps, timings = [], {"setup_s": setup_s}
    optimizers = None
    if cell.scenario != INFERENCE:
        sgd = OPTIMIZERS["SGD"]
        optimizers = [sgd.make(m.parameters()) for m in (under_test, eager, eager_tp)]
    for step in range(1 if cell.scenario == INFERENCE else STEPS):
        progress.at(f"step {step}")
        began = time.perf_counter()
        hooks = _recording(eager, layers) if step == 0 else []
        steps.append(_step(step, parts, under_test, eager, eager_tp, optimizers))
        for hook in hooks:
            hook.remove()
        timings[f"step{step}_s"] = time.perf_counter() - began
    timings["thunder_s"] = clock.thunder_s()
    return TensorParallelRecord(
        cell=cell,
        rank=rank,
        world_size=world,
        shapes={n: tuple(p.shape) for n, p in eager.named_parameters()},
        layers=layers,
        placements=placements,
        steps=steps,
        reached=reached.reached_thunder(under_test, breaks),
        timings=timings,
        declared=declared,
        alive_after_setup=alive_after_setup,
        itemsize=parts.dtype.itemsize,
        buffer_bytes=sum(b.nbytes for b in eager.buffers()),
    )


def _step(
    step: int,
    parts: Any,
    under_test: Any,
    eager: nn.Module,
    eager_tp: nn.Module,
    optimizers: list[torch.optim.Optimizer] | None,
) -> TensorParallelStep:
    """One forward (and, training, backward and SGD step) of all three models on the same
    whole batch; the model under test's collectives counted by phase."""
    issued: list[Issued] = []
    x = parts.fixture.make_input(generator(step), parts.dtype).to(parts.device)
    training = optimizers is not None
    grad_mode = torch.enable_grad() if training else torch.no_grad()
    with grad_mode:
        with thunder_call("forward"), counting(issued, "forward"):
            out = under_test(x)
        expected = eager(x)
        expected_tp = _whole(eager_tp(x))
    got = _whole(out)
    if (wrong := unweighable(got, expected)) is not None:
        raise ThunderReturnedWrong(f"step {step}: the tensor-parallel model's output {wrong}")
    copies = {"output": cpu_copy(got), "eager": cpu_copy(expected), "eager_tp": cpu_copy(expected_tp)}
    record = TensorParallelStep(**copies, issued=issued)
    if not training:
        return record
    cotangent = torch.randn(expected.shape, generator=generator(step, _COTANGENT_KEY)).to(parts.device, expected.dtype)
    with thunder_call("backward"), counting(issued, "backward"):
        loss(got, cotangent).backward()
    loss(expected, cotangent).backward()
    loss(expected_tp, cotangent).backward()
    record.grads = _full(under_test, grads=True)
    record.eager_grads = _full(eager, grads=True)
    record.eager_tp_grads = _full(eager_tp, grads=True)
    with thunder_call("optimizer step"), counting(issued, "optimizer step"):
        optimizers[0].step()
    for optimizer in optimizers[1:]:
        optimizer.step()
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    record.after = _full(under_test)
    record.eager_after = _full(eager)
    record.eager_tp_after = _full(eager_tp)
    return record


def _recording(eager: nn.Module, layers: list[PlannedLayer]) -> list[Any]:
    """Forward hooks on eager's whole model that note each planned Linear's calls."""

    def hook(layer: PlannedLayer) -> Any:
        def noted(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
            (x,) = inputs
            layer.calls.append(
                LayerCall(tuple(x.shape), tuple(output.shape), x.requires_grad, output.element_size())
            )

        return noted

    return [eager.get_submodule(layer.name).register_forward_hook(hook(layer)) for layer in layers]


def _whole(t: Any) -> Any:
    """A DTensor as the whole tensor its shards make (a model that should have returned one),
    anything else as it is: what is wrong with it is numerics' to name."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _full(model: Any, grads: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter (or its gradient; none: left out) whole, by eager's names, on the CPU."""
    out = {}
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is not None:
            out[name] = cpu_copy(_whole(t))
    return out


def _placed(p: torch.Tensor) -> Placed:
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        return Placed(tuple(_named(q) for q in p.placements), p.device_mesh.size(), tuple(p.to_local().shape))
    return Placed(None, None, tuple(p.shape))


def _named(placement: Any) -> str:
    """A DTensor placement as checks/megatron.py names them (``shard(0)``, ``replicate``)."""
    if placement.is_shard():
        return f"shard({placement.dim})"
    if placement.is_replicate():
        return "replicate"
    if placement.is_partial():
        return "partial"
    return str(placement)

"""The rank side of a cell: build it once, drive a few training steps, then let every check
area read what was recorded.

Tracing dominates a cell's cost, so a cell is built and run exactly once per rank and the
check areas (numerics, collectives, ...) only inspect the recorded run.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from conformance import collectives, numerics
from conformance.cells import Cell
from conformance.compose import COMPOSITIONS
from fixtures import inits
from fixtures.models import MODELS

SEED = 1234
STEPS = 3
LR = 0.05
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

CHECKS: dict[str, Callable[[CellRun], Any]] = {
    "numerics": numerics.check,
    "collectives": collectives.check,
}


@dataclasses.dataclass
class StepRecord:
    output: torch.Tensor  # this rank's output from the Thunder module
    reference_output: torch.Tensor  # eager output on the same input
    grads: dict[str, torch.Tensor]  # full (unsharded) gradients gathered from every rank's shard
    reference_grads: dict[str, torch.Tensor]


@dataclasses.dataclass
class CellRun:
    cell: Cell
    rank: int
    device: torch.device
    dtype: torch.dtype
    reference: nn.Module  # eager single-process model, stepped alongside
    thunder_module: Any
    initial: dict[str, torch.Tensor]  # full parameters right after setup, gathered from shards
    reference_initial: dict[str, torch.Tensor]
    steps: list[StepRecord]
    final: dict[str, torch.Tensor]
    reference_final: dict[str, torch.Tensor]
    timings: dict[str, float]

    @property
    def on_meta(self) -> bool:
        return inits.INITS[self.cell.init].on_meta


def rank_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _generator(*key: int) -> torch.Generator:
    seed = SEED
    for k in key:
        seed = seed * 1_000_003 + k
    return torch.Generator().manual_seed(seed % (2**63))


def unshard(shard: torch.Tensor, full_shape: torch.Size) -> torch.Tensor:
    """Rebuild a full tensor from every rank's dim-0 shard (Thunder pads dim 0 to a multiple)."""
    world = dist.get_world_size()
    chunk = -(-full_shape[0] // world)
    assert tuple(shard.shape) == (chunk, *full_shape[1:]), (
        f"shard of shape {tuple(shard.shape)} does not fit a dim-0 sharding of {tuple(full_shape)} "
        f"over {world} ranks (expected {(chunk, *full_shape[1:])})"
    )
    parts = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(parts, shard.detach().contiguous())
    return torch.cat(parts)[: full_shape[0]].cpu()


def _gather(tm: Any, shapes: dict[str, torch.Size], grads: bool = False) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape in shapes.items():
        p = tm.get_parameter(name)
        t = p.grad if grads else p
        if t is None:  # kept symmetric across ranks: a missing gradient compares as NaN
            t = torch.full_like(p, float("nan"))
        out[name] = unshard(t, shape)
    return out


def _snapshot(module: nn.Module, grads: bool = False) -> dict[str, torch.Tensor]:
    return {
        n: (p.grad if grads else p).detach().cpu().clone()
        for n, p in module.named_parameters()
        if not grads or p.grad is not None
    }


def drive(cell: Cell) -> CellRun:
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == cell.world_size, f"cell wants {cell.world_size} ranks, the world has {world}"
    device, dtype = rank_device(), DTYPES[cell.dtype]
    fixture, init = MODELS[cell.model], inits.INITS[cell.init]
    make = functools.partial(fixture.build, cell.tie == "tied")

    torch.manual_seed(SEED)
    with torch.device(device):
        reference = make().to(dtype)
    shapes = {n: p.shape for n, p in reference.named_parameters()}  # one name per tied group

    timings: dict[str, float] = {}
    began = time.perf_counter()
    torch.manual_seed(SEED)
    subject = inits.build(init, make, device, dtype)
    options = {
        "sharding_strategy": _enum("FSDPType", cell.sharding),
        "bucketing_strategy": _enum("FSDPBucketingStrategy", cell.bucketing),
    }
    tm = COMPOSITIONS[cell.composition](subject, device, init.materialization(), options)
    timings["setup_s"] = time.perf_counter() - began

    reference_initial = _snapshot(reference)
    initial = _gather(tm, shapes)
    if init.on_meta:
        # Thunder chose these weights; the reference adopts them so the steps can be compared.
        with torch.no_grad():
            for n, p in reference.named_parameters():
                p.copy_(initial[n])

    opt, ref_opt = torch.optim.SGD(tm.parameters(), lr=LR), torch.optim.SGD(reference.parameters(), lr=LR)
    steps = []
    for step in range(STEPS):
        began = time.perf_counter()
        inputs = [fixture.make_input(_generator(step, r), dtype).to(device) for r in range(world)]
        out = tm(inputs[rank])
        ref_outs = [reference(x) for x in inputs]
        cotangents = [
            torch.randn(o.shape, generator=_generator(step, r, 7)).to(device, dtype) for r, o in enumerate(ref_outs)
        ]
        (out * cotangents[rank]).sum().backward()
        # FSDP averages gradients over ranks: the reference loss is the mean of the ranks' losses.
        (sum((o * c).sum() for o, c in zip(ref_outs, cotangents, strict=True)) / world).backward()
        steps.append(
            StepRecord(
                output=out.detach().cpu(),
                reference_output=ref_outs[rank].detach().cpu(),
                grads=_gather(tm, shapes, grads=True),
                reference_grads=_snapshot(reference, grads=True),
            )
        )
        opt.step()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        timings[f"step{step}_s"] = time.perf_counter() - began

    return CellRun(
        cell=cell,
        rank=rank,
        device=device,
        dtype=dtype,
        reference=reference,
        thunder_module=tm,
        initial=initial,
        reference_initial=reference_initial,
        steps=steps,
        final=_gather(tm, shapes),
        reference_final=_snapshot(reference),
        timings=timings,
    )


def _enum(name: str, value: str) -> Any:
    import thunder.distributed

    return getattr(thunder.distributed, name)[value.upper()]


def run_cell(axes: dict[str, Any]) -> dict[str, Any]:
    """Entry point the controller names in a Task: every check area's findings on this rank."""
    run = drive(Cell(**axes))
    return {
        "checks": {area: check(run).as_dict() for area, check in CHECKS.items()},
        "timings": run.timings,
    }

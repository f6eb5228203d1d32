"""The rank side of a cell: build it once, drive a few training steps beside eager PyTorch,
then let every check area read what was recorded.

Tracing dominates a cell's cost, so a cell is built and run exactly once per rank and the
check areas (materialization, numerics, collectives, state_dict) only inspect the record.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from conformance import collectives, materialization, memory, numerics, offload, state_dict
from conformance.cells import Cell, applies, expects_reset_error, plan
from conformance.compose import COMPOSITIONS
from conformance.findings import Findings
from fixtures import inits
from fixtures.models import fixture_for
from fixtures.offloads import POLICIES

SEED = 1234
STEPS = 3  # per optimizer: SGD, then AdamW
# Small steps: trajectories that jump far amplify rounding differences chaotically and would
# turn any tolerance into a guess.
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1),
    # eps above the rounding noise of parameters whose true gradient is zero (an attention
    # key bias): Adam would normalize that noise into full-size steps
    "AdamW": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, eps=1e-6),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

CHECKS: dict[str, Callable[[CellRun], Findings]] = {
    "materialization": materialization.check,
    "numerics": numerics.check,
    "collectives": collectives.check,
    "state_dict": state_dict.check,
    "memory": memory.check,
    "offload": offload.check,
}
MEASURED_STEP = 1  # the first step compiles; the second shows the steady state


class Unsupported(Exception):
    """The Thunder under test does not offer what the cell asks for (a probe said so)."""


@dataclasses.dataclass
class StepRecord:
    output: torch.Tensor  # this rank's output from the Thunder module
    reference_output: torch.Tensor  # eager output on the same input
    grads: dict[str, torch.Tensor]  # full (unsharded) gradients gathered from every rank's shard
    reference_grads: dict[str, torch.Tensor]
    golden_output: torch.Tensor | None = None  # float32 twin of the reference (low-precision cells)
    golden_grads: dict[str, torch.Tensor] | None = None


@dataclasses.dataclass(frozen=True)
class SavedTensor:
    """One tensor the Thunder module's autograd node saved for backward, as found after the
    measured step's forward."""

    offloaded: bool  # in a storage the reference offloading transform created
    device: str
    nbytes: int


@dataclasses.dataclass
class CellRun:
    cell: Cell
    rank: int
    device: torch.device
    dtype: torch.dtype
    reference: nn.Module  # eager single-process model, stepped alongside
    thunder_module: Any
    placement: dict[str, str]  # device of every parameter and buffer right after setup
    initial: dict[str, torch.Tensor]  # full parameters right after setup, gathered from shards
    reference_initial: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]  # the Thunder module's buffers right after setup
    reference_buffers: dict[str, torch.Tensor]
    first_step: StepRecord
    after: dict[str, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]  # optimizer -> (full, reference)
    golden_after: dict[str, dict[str, torch.Tensor]]  # optimizer -> float32 twin's parameters
    original_state_dict: dict[str, torch.Tensor]  # tm.original_state_dict() after training
    reference_state_dict: dict[str, torch.Tensor]
    reloaded: dict[str, torch.Tensor]  # full parameters after load_original_state_dict(loaded)
    loaded: dict[str, torch.Tensor]
    memory: dict[str, int]  # phase -> peak bytes allocated during it
    held: dict[str, int]  # phase -> bytes it allocated that were still alive at its end
    saved: list[SavedTensor | None] | None  # what the autograd node holds between forward and backward
    eager_memory: dict[str, int]  # forward and backward of the eager model on this rank's input
    retained: int  # bytes alive right after setup that the kit does not hold itself
    backend: str
    timings: dict[str, float]

    @property
    def init(self) -> inits.InitMode:
        return inits.INITS[self.cell.init]


def rank_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _generator(*key: int) -> torch.Generator:
    seed = SEED
    for k in key:
        seed = seed * 1_000_003 + k
    return torch.Generator().manual_seed(seed % (2**63))


def shard(full: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's dim-0 chunk of ``full``, padded the way Thunder's FSDP pads."""
    chunk = -(-full.shape[0] // world)
    padded = torch.zeros((chunk * world, *full.shape[1:]), dtype=full.dtype, device=full.device)
    padded[: full.shape[0]] = full
    return padded[rank * chunk : (rank + 1) * chunk].clone()


def unshard(piece: torch.Tensor, full_shape: torch.Size) -> torch.Tensor:
    """Rebuild a full tensor from every rank's dim-0 shard (Thunder pads dim 0 to a multiple)."""
    world = dist.get_world_size()
    chunk = -(-full_shape[0] // world)
    assert tuple(piece.shape) == (chunk, *full_shape[1:]), (
        f"shard of shape {tuple(piece.shape)} does not fit a dim-0 sharding of {tuple(full_shape)} "
        f"over {world} ranks (expected {(chunk, *full_shape[1:])})"
    )
    parts = [torch.empty_like(piece) for _ in range(world)]
    dist.all_gather(parts, piece.detach().contiguous())
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
    named = ((n, p.grad if grads else p) for n, p in module.named_parameters())
    return _cpu((n, t) for n, t in named if t is not None)


def _cpu(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Detached CPU copies, safe from later training steps."""
    return {n: t.detach().cpu().clone() for n, t in named}


def _clone(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in sd.items()}


def _materialization(how: str, state: dict[str, torch.Tensor] | None) -> Any:
    """The MaterializationTransform init: module init, or from ``state`` (original or transformed)."""
    from thunder.transforms import MaterializationTransform

    if how == "module":
        return MaterializationTransform.init_from_original_module_init()
    if how == "original":
        return MaterializationTransform.init_from_original_state_dict(state)
    return MaterializationTransform.init_from_transformed_state_dict(state)


def _state_dict(kind: str | None, reference: nn.Module, rank: int, world: int) -> dict[str, torch.Tensor] | None:
    """The state dict the kit hands Thunder, as a user would: "original" or "transformed"."""
    if kind == "original":
        return _clone(reference.state_dict())
    if kind == "transformed":
        return transformed_state_dict(reference, rank, world)
    return None


def transformed_state_dict(reference: nn.Module, rank: int, world: int) -> dict[str, torch.Tensor]:
    """The reference's state dict as FSDP holds it on ``rank``: parameters sharded, buffers whole."""
    names = {n for n, _ in reference.named_parameters(remove_duplicate=False)}
    tied_duplicates = names - {n for n, _ in reference.named_parameters()}
    return {
        k: shard(v, rank, world) if k in names else v.clone()
        for k, v in reference.state_dict().items()
        if k not in tied_duplicates
    }


def drive(cell: Cell) -> CellRun:
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == cell.world_size, f"cell wants {cell.world_size} ranks, the world has {world}"
    device, dtype = rank_device(), DTYPES[cell.dtype]
    fixture, init, composition = (
        fixture_for(cell.model, cell.spec),
        inits.INITS[cell.init],
        COMPOSITIONS[cell.composition],
    )
    if composition.probe is not None and (reason := composition.probe(device)):
        raise Unsupported(reason)
    make = functools.partial(fixture.build, cell.tie == "tied")
    source = world - 1 if init.broadcast else 0  # whose weights every rank ends up with

    eager_peaks: dict[str, int] = {}  # the same phases in eager PyTorch, unsharded: a second reference
    torch.manual_seed(SEED + source)
    with torch.device(device), memory.measure(device, eager_peaks, "setup"):
        reference = make().to(dtype)
    shapes = {n: p.shape for n, p in reference.named_parameters()}  # one name per tied group
    reference_initial = _snapshot(reference)

    timings: dict[str, float] = {}
    peaks: dict[str, int] = {}
    held: dict[str, int] = {}
    saved: list[SavedTensor | None] | None = None
    began = time.perf_counter()
    materialize, load = plan(cell)
    options: dict[str, Any] = {
        "sharding_strategy": _enum("FSDPType", cell.sharding),
        "bucketing_strategy": _enum("FSDPBucketingStrategy", cell.bucketing),
    }
    if init.broadcast:
        options["broadcast_from"] = source
    # What the kit hands over is built outside the measured block: it is the user's memory.
    # One of the two takes it: plan() loads after setup only where materialization is by module init.
    state = _state_dict(load or materialize, reference, rank, world)
    materialization_init = _materialization(materialize, state)
    with memory.measure(device, peaks, "setup"):
        torch.manual_seed(SEED + (rank if init.broadcast else 0))
        model = inits.build(init, make, device, dtype)
        tm = composition.build(model, device, materialization_init, options, _transforms(cell, device))
        if load == "original":
            tm.load_original_state_dict(state)
        elif load == "transformed":
            tm.load_state_dict(state)
    del state, materialization_init
    timings["setup_s"] = time.perf_counter() - began
    kit_held = memory.pointers(*reference.parameters(), *reference.buffers(), *reference_initial.values())
    retained = memory.census(device, kit_held)

    placement = {n: str(t.device) for n, t in (*tm.named_parameters(), *tm.named_buffers())}
    buffers = _cpu(tm.named_buffers())
    initial = _gather(tm, shapes)
    if not init.values_from_reference:
        # Thunder drew these weights; the reference adopts them so the steps can be compared.
        with torch.no_grad():
            for n, p in reference.named_parameters():
                p.copy_(initial[n])

    # Below float32, eager's own rounding sets the tolerance: a float32 twin trains in lockstep
    # and Thunder may stray from it at most a stated factor further than eager does.
    golden = copy.deepcopy(reference).float() if dtype != torch.float32 else None
    first_step: StepRecord | None = None
    after, golden_after = {}, {}
    step = 0
    for opt_name, make_opt in OPTIMIZERS.items():
        opt, ref_opt = make_opt(tm.parameters()), make_opt(reference.parameters())
        golden_opt = make_opt(golden.parameters()) if golden is not None else None
        for _ in range(STEPS):
            began = time.perf_counter()
            inputs = [fixture.make_input(_generator(step, r), dtype).to(device) for r in range(world)]
            measured = peaks if step == MEASURED_STEP else {}
            with memory.measure(device, measured, "forward", held if step == MEASURED_STEP else None):
                out = tm(inputs[rank])
            if step == MEASURED_STEP:
                saved = _saved_tensors(out)
            ref_outs = [reference(x) for x in inputs]
            cotangents = [
                torch.randn(o.shape, generator=_generator(step, r, 7)).to(device, dtype) for r, o in enumerate(ref_outs)
            ]
            loss = (out * cotangents[rank]).mean()
            with memory.measure(device, measured, "backward"):
                loss.backward()
            if step == MEASURED_STEP:
                _measure_eager(reference, inputs[rank], cotangents[rank], device, eager_peaks)
            # FSDP averages gradients over ranks: the reference loss is the mean of the ranks' losses.
            _mean_loss(ref_outs, cotangents).backward()
            golden_outs = None
            if golden is not None:
                golden_outs = [golden(x if not x.is_floating_point() else x.float()) for x in inputs]
                _mean_loss(golden_outs, [c.float() for c in cotangents]).backward()
            if first_step is None:
                first_step = StepRecord(
                    output=out.detach().cpu(),
                    reference_output=ref_outs[rank].detach().cpu(),
                    grads=_gather(tm, shapes, grads=True),
                    reference_grads=_snapshot(reference, grads=True),
                    golden_output=None if golden_outs is None else golden_outs[rank].detach().cpu(),
                    golden_grads=None if golden is None else _snapshot(golden, grads=True),
                )
            with memory.measure(device, measured, "step"):
                opt.step()
            for o in (opt, ref_opt, golden_opt):
                if o is not None:
                    if o is not opt:
                        o.step()
                    o.zero_grad(set_to_none=True)
            timings[f"step{step}_s"] = time.perf_counter() - began
            step += 1
        after[opt_name] = (_gather(tm, shapes), _snapshot(reference))
        if golden is not None:
            golden_after[opt_name] = _snapshot(golden)

    # State-dict round trip, last: it rewrites the module's weights.
    original_sd = _cpu(tm.original_state_dict().items())
    loaded = {n: t.to(device) for n, t in reference_initial.items()}
    tm.load_original_state_dict({**_clone(reference.state_dict()), **loaded})

    assert first_step is not None
    return CellRun(
        cell=cell,
        rank=rank,
        device=device,
        dtype=dtype,
        reference=reference,
        thunder_module=tm,
        placement=placement,
        initial=initial,
        reference_initial=reference_initial,
        buffers=buffers,
        reference_buffers=_cpu(reference.named_buffers()),
        first_step=first_step,
        after=after,
        golden_after=golden_after,
        original_state_dict=original_sd,
        reference_state_dict=_cpu(reference.state_dict().items()),
        reloaded=_gather(tm, shapes),
        loaded={n: t.cpu() for n, t in loaded.items()},
        memory=peaks,
        held=held,
        saved=saved,
        eager_memory=eager_peaks,
        retained=retained,
        backend=dist.get_backend(),
        timings=timings,
    )


def _transforms(cell: Cell, device: torch.device) -> list[Any]:
    """The cell's transforms beside sharding: the reference offloading transform, to the CPU."""
    policy = POLICIES[cell.offload]
    if policy is None:
        return []
    from transforms.offload import OffloadTransform

    return [OffloadTransform(policy, source=device, destination="cpu")]


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


def _measure_eager(
    reference: nn.Module, x: torch.Tensor, cotangent: torch.Tensor, device: torch.device, into: dict[str, int]
) -> None:
    """Eager's peaks for this rank's input; gradients are returned, not accumulated, so the
    reference's own training is untouched."""
    with memory.measure(device, into, "forward"):
        out = reference(x)
    loss = (out * cotangent).mean()
    with memory.measure(device, into, "backward"):
        torch.autograd.grad(loss, [p for p in reference.parameters() if p.requires_grad])


def _mean_loss(outputs: list[torch.Tensor], cotangents: list[torch.Tensor]) -> torch.Tensor:
    return sum((o * c).mean() for o, c in zip(outputs, cotangents, strict=True)) / len(outputs)


def _enum(name: str, value: str) -> Any:
    import thunder.distributed

    return getattr(thunder.distributed, name)[value.upper()]


def run_cell(axes: dict[str, Any]) -> dict[str, Any]:
    """Entry point the controller names in a Task: every check area's findings on this rank,
    or why the cell could not be built."""
    cell = Cell(**axes)
    try:
        run = drive(cell)
    except Unsupported as exc:
        return {"unsupported": str(exc)}
    except TypeError as exc:
        if not expects_reset_error(cell):
            raise
        return {"checks": {"materialization": materialization.reset_error(cell, exc).as_dict()}, "timings": {}}
    if expects_reset_error(cell):
        found = materialization.reset_error(cell, None)
        return {"checks": {"materialization": found.as_dict()}, "timings": run.timings}
    return {
        "checks": {area: check(run).as_dict() for area, check in CHECKS.items() if applies(cell, area)},
        "timings": run.timings,
    }

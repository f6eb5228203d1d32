"""``resume``: a checkpoint taken after training and loaded into a fresh composition of the same
cell must resume training bit for bit where the uninterrupted run goes.

Each kind of checkpoint Thunder offers is one round trip: the full state dict (eager's names,
every parameter whole: ``thunder.distributed.checkpoint`` with ``full_state_dict=True``, saved
with its ``save`` and read back with its ``load``) and, where parameters are sharded, the
sharded one (each rank its own shards). What the checkpoint holds is compared with the kit's
own gathering at the same moment. The optimizer's state is checkpointed beside it: the
Thunder module's AdamW as training left it (its moments and step count), through
``optimizer.state_dict()``, one file per rank (under FSDP the moments are this rank's
shards; Thunder's checkpoint module offers no optimizer API). The fresh module gets its
optimizer before either is loaded (as a training script builds both, then restores); its
state after loading must be the uninterrupted optimizer's, and then both modules take
``RESUME_STEPS`` AdamW steps on the same batches, the uninterrupted one with training's own
optimizer: their weights after loading, and every step's outputs, gradients, weights and
buffers, must be equal exactly (the same program on the same values: on one device nothing
may differ).

Where ``thunder.distributed.checkpoint`` cannot take the checkpoint (its FSDP path builds a
CUDA device mesh), the error is recorded and the Thunder module's own state dict methods it
wraps stand in (``original_state_dict()`` for a full one, ``state_dict()`` for a sharded one),
so that the round trip is still judged; loading always goes through
``load_model_state_dict``, which needs no mesh.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.checkpoint_record import Compared, Resumed
from conformance.checks.findings import identical
from conformance.checks.record import ScenarioRecord
from conformance.rank.build import EagerModel, Recipe, compose
from conformance.rank.clock import thunder_call
from conformance.rank.eager import loss
from conformance.rank.gather import cpu_copies, local_copies, on_every_rank, padding_cleared, shard
from conformance.rank.raised import origin
from conformance.rank.scenarios.beside import AFTER_TRAINING, Batch
from conformance.rank.scenarios.rank0_only import rank0_only
from fixtures.optimizers import OPTIMIZERS

RESUME_STEPS = 2  # the second AdamW step reads the optimizer state the first one made
Tensors = dict[str, torch.Tensor]


def resume(
    recipe: Recipe, eager_model: EagerModel, tm: Any, optimizer: Any, rank: int, world: int
) -> ScenarioRecord:
    # DDP holds whole parameters: Thunder refuses a sharded checkpoint of it, by design
    kinds = ("full",) if eager_model.replicated else ("full", "sharded")
    directory = shared_directory()
    try:
        resumed = [
            _round_trip(kind, recipe, eager_model, tm, optimizer, rank, world, directory / kind) for kind in kinds
        ]
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    on_rank0 = rank0_only(recipe, eager_model, tm, truth_of("full", eager_model, tm, rank, world), rank, world)
    return ScenarioRecord("resume", resumed=resumed, rank0_only=on_rank0)


def _round_trip(
    kind: str, recipe: Recipe, eager_model: EagerModel, tm: Any, optimizer: Any, rank: int, world: int, path: Path
) -> Resumed:
    from thunder.distributed.checkpoint import StateDictOptions, load_model_state_dict

    full = kind == "full"
    options = StateDictOptions(full_state_dict=full, cpu_offload=True)
    truth = truth_of(kind, eager_model, tm, rank, world)
    try:
        taken = take(tm, options, rank)
    except Exception as exc:  # the module's own state dict method raised too
        return Resumed(kind, taken={}, truth=truth, error=f"{type(exc).__name__}: {exc}")
    held = local_copies(taken.state)
    if not full:
        held = {n: padding_cleared(t, truth.get(n), eager_model.shapes.get(n), rank) for n, t in held.items()}
    record = Resumed(kind, taken=held, truth=truth, api_error=taken.error, api_origin=taken.origin)
    # a buffer the ranks hold differently (running statistics of each rank's own batches): a
    # full checkpoint holds one value of it, which every rank then loads and goes on from
    unlike = unlike_on_ranks(tm) if full else set()
    try:
        fresh = compose(recipe, eager_model).thunder_module
        # the fresh module's optimizer first, made as training makes it: loading must write
        # the parameters it steps, and its state must line up with the checkpoint's
        optimizers = [OPTIMIZERS["AdamW"].make(fresh.parameters()), optimizer]
        template = clones_to_load(take(fresh, options, rank).state)
        per_rank = kind == "sharded" and not _has_dtensors(taken.state)
        _save(taken.state, path, rank, per_rank)
        _load(template, path, rank, per_rank)
        load_model_state_dict(template, fresh, options, rank)
        optimizers[0].load_state_dict(_optimizer_round_trip(optimizer, path, rank))
        loaded = {n: t.cpu() for n, t in template.items() if n in unlike}
        resumed_beside(record, recipe, eager_model, (fresh, tm), optimizers, loaded, unlike, rank, world)
    except Exception as exc:  # Thunder's own calls: what it raises is a finding, not the end of the cell
        record.error = f"{type(exc).__name__}: {exc}"
    return record


def resumed_beside(
    record: Resumed,
    recipe: Recipe,
    eager_model: EagerModel,
    modules: tuple[Any, Any],
    optimizers: list[Any],
    loaded: Tensors,
    unlike: set[str],
    rank: int,
    world: int,
) -> None:
    """The module resumed from the checkpoint beside the uninterrupted one (``modules``, each
    with its optimizer, in that order): their weights, buffers and optimizer state after
    loading, then every output, gradient and weight of ``RESUME_STEPS`` AdamW steps on the same
    batches, appended to ``record``. What a call raises propagates (the caller records it)."""
    fresh, tm = modules
    record.compared += _moment("after loading", eager_model, fresh, tm, loaded=loaded)
    states = (optimizer_state(o, m) for o, m in zip(optimizers, modules, strict=True))
    record.compared.append(Compared("optimizer state after loading", *states))
    model = copy.deepcopy(eager_model.module)  # for the cotangents' shapes: its buffers are its own
    for k in range(RESUME_STEPS):
        batch = Batch.draw(recipe.fixture.make_input, recipe, model, AFTER_TRAINING + k, world)
        outputs = [_forward_backward(m, batch, rank) for m in modules]
        record.compared.append(Compared(f"output at resumed step {k}", *outputs))
        grads = [eager_model.gather(m, grads=True) for m in modules]
        record.compared.append(Compared(f"gradients at resumed step {k}", *grads))
        for opt in optimizers:
            with thunder_call():
                opt.step()
                opt.zero_grad(set_to_none=True)
        record.compared += _moment(f"after resumed step {k}", eager_model, fresh, tm, unlike=unlike)


@dataclasses.dataclass
class Taken:
    """A checkpoint as ``take`` took it: the state dict, and, where ``get_model_state_dict``
    raised (the module's own state dict standing in), what it raised and whose code raised it."""

    state: Tensors
    error: str | None = None  # ``Kind: message``
    origin: str | None = None  # conformance.rank.raised.origin


def take(tm: Any, options: Any, rank: int) -> Taken:
    """The checkpoint through ``get_model_state_dict``, or, where it raises, through the
    module's own method it wraps, with what it raised."""
    from thunder.distributed.checkpoint import get_model_state_dict

    try:
        return Taken(get_model_state_dict(tm, options, rank))
    except Exception as exc:
        own = tm.original_state_dict() if options.full_state_dict else tm.state_dict()
        return Taken(cpu_copies(own.items()), f"{type(exc).__name__}: {exc}", origin(exc))


def truth_of(kind: str, eager_model: EagerModel, tm: Any, rank: int, world: int) -> Tensors:
    """What a checkpoint of ``kind`` must hold now: the parameters the kit gathers (this rank's
    shard of each for a sharded one) and the buffers, under the eager state dict's names."""
    names = set(eager_model.module.state_dict())
    params = eager_model.gather(tm)
    if kind == "sharded":
        params = {n: shard(t, rank, world) for n, t in params.items()}
    buffers = cpu_copies((n, b) for n, b in tm.named_buffers() if n in names)
    return {**buffers, **params}


def _optimizer_round_trip(optimizer: Any, path: Path, rank: int) -> dict[str, Any]:
    """``optimizer.state_dict()`` saved to this rank's own file and read back."""
    file = path.parent / f"{path.name}-optimizer" / f"rank{rank}.pt"
    file.parent.mkdir(parents=True, exist_ok=True)
    torch.save(optimizer.state_dict(), file)
    return torch.load(file, weights_only=True)


def optimizer_state(optimizer: Any, module: Any) -> Tensors:
    """CPU copies of an optimizer's state, "<parameter> <key>" (e.g. "fc1.weight exp_avg_sq",
    "fc1.weight step") by the module's names for the parameters it steps; a DTensor's (FSDP2's
    moments) as this rank's local shard."""
    from torch.distributed.tensor import DTensor

    names = {id(p): n for n, p in module.named_parameters()}
    state = {}
    for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"]):
        for key, value in optimizer.state.get(p, {}).items():
            value = value.to_local() if isinstance(value, DTensor) else torch.as_tensor(value)
            state[f"{names.get(id(p), f'parameter {i}')} {key}"] = value.detach().cpu().clone()
    return state


def clones_to_load(state: dict[str, Any]) -> dict[str, Any]:
    """Copies to load into, so that reading the checkpoint cannot write a module's own
    tensors behind ``load_model_state_dict``'s back (a plain state dict views them)."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def shared_directory() -> Path:
    """A directory every rank sees (one machine), made by rank 0."""
    name = [tempfile.mkdtemp(prefix="kit-resume-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(name, src=0)
    return Path(name[0])


def _save(state: dict[str, Any], path: Path, rank: int, per_rank: bool) -> None:
    """With ``thunder.distributed.checkpoint.save`` (torch's distributed checkpoint), which
    takes whole tensors and DTensors; plain shards (``per_rank``: the stand-in for a sharded
    checkpoint) would read to it as one tensor every rank holds, so each rank writes its own
    file."""
    from thunder.distributed.checkpoint import save

    if per_rank:
        path.mkdir(parents=True, exist_ok=True)
        torch.save(state, path / f"rank{rank}.pt")
        dist.barrier()
    else:
        save(state, path)


def _load(state: dict[str, Any], path: Path, rank: int, per_rank: bool) -> None:
    """Read the checkpoint at ``path`` into ``state``'s tensors, in place."""
    from thunder.distributed.checkpoint import load

    if per_rank:
        for k, v in torch.load(path / f"rank{rank}.pt", weights_only=True).items():
            state[k].copy_(v)
    else:
        load(state, path)


def _has_dtensors(state: dict[str, Any]) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(v, DTensor) for v in state.values())


def _forward_backward(tm: Any, batch: Batch, rank: int) -> Tensors:
    with thunder_call():
        out = tm(batch.inputs[rank])
        loss(out, batch.cotangents[rank]).backward()
    return {"output": out.detach().cpu().clone()}


def _moment(
    when: str,
    eager_model: EagerModel,
    fresh: Any,
    tm: Any,
    loaded: Tensors | None = None,
    unlike: set[str] = frozenset(),
) -> list[Compared]:
    """The two modules' weights and buffers now; a buffer in ``loaded`` must hold the value
    the checkpoint gave it, and one in ``unlike`` is not compared (each rank's went its own way
    before the checkpoint)."""
    weights = [eager_model.gather(m) for m in (fresh, tm)]
    resumed, uninterrupted = (
        {n: b for n, b in cpu_copies(m.named_buffers()).items() if n not in unlike} for m in (fresh, tm)
    )
    uninterrupted.update(loaded or {})
    return [Compared(f"weights {when}", *weights), Compared(f"buffers {when}", resumed, uninterrupted)]


def unlike_on_ranks(tm: Any) -> set[str]:
    """Names of the buffers whose value is not the same on every rank."""
    mine = cpu_copies(tm.named_buffers())
    every = on_every_rank(mine)
    return {n for n, t in mine.items() if any(not identical(t, other.get(n)) for other in every)}

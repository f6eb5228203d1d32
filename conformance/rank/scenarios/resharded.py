"""``resume`` at another world size (conformance/matrix/resharded.py): a checkpoint taken after
training in a world of ``saved_at`` ranks, loaded into a fresh composition at the cell's
world size, must resume training bit for bit where a composition at that size handed the same
state by the kit goes.

The saving world runs ``save``, a task of its own: it trains the cell as the cell's own world
trains it, takes the full checkpoint through ``thunder.distributed.checkpoint`` (every
parameter whole, eager's names; ``original_state_dict()`` standing in where
``get_model_state_dict`` raises, as in ``resume``), saves it with that module's ``save``, and
writes beside it the kit's own gathering at the same moment: every parameter whole, the
buffers, and AdamW's state with each moment gathered whole as its parameter is.

The resuming world runs ``resume_resharded`` as the cell's scenario: the checkpoint is read
(``load``) into a fresh composition's template and loaded with ``load_model_state_dict``; a
second fresh composition is loaded, the same way, with the kit's gathering instead. Thunder
offers no optimizer checkpoint, so both AdamWs are handed the saving world's moments cut for
this world as Thunder's FSDP cuts parameters (the kit's resharding, the same for both). Then
both take ``RESUME_STEPS`` AdamW steps on the same batches: weights after loading, and every
output, gradient and weight after, must be equal exactly (one program on the same values).
What the checkpoint read back holds is held to the kit's gathering too, exactly.

Under PyTorch's FSDP2 (``thunderfx_fsdp2``) the checkpoint is DCP's, as in ``resume_dcp``:
``get_state_dict`` of the model and its AdamW (each rank's DTensor shards) and ``dcp.save`` at
``saved_at`` ranks; ``dcp.load`` into a fresh composition's state dicts and ``set_state_dict``
at this size, DCP resharding both. The second composition is handed the kit's gathering as a
full state dict (``set_model_state_dict``, as its setup loads one) and the moments distributed
as its parameters are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.checkpoint_record import Resumed
from conformance.checks.record import ScenarioRecord
from conformance.matrix.cells import Cell
from conformance.rank import progress
from conformance.rank.build import EagerModel, Recipe, Unsupported, build_eager_model, compose, recipe
from conformance.rank.gather import local_copies, local_shape, rank_device, shard, unshard
from conformance.rank.raised import origin
from conformance.rank.scenarios.resume import clones_to_load, resumed_beside, take, truth_of
from conformance.rank.scenarios.resume_dcp import TAKEN_BY as DCP_TAKEN_BY
from conformance.rank.scenarios.resume_dcp import whole
from conformance.rank.train import train
from fixtures import torch_parallel as tp
from fixtures.optimizers import OPTIMIZERS

CHECKPOINT = "full"  # the checkpoint's folder, as thunder.distributed.checkpoint.save wrote it
GATHERED = "gathered.pt"  # the kit's gathering at the saving world's moment (its rank 0 writes it)
Tensors = dict[str, torch.Tensor]


def save(axes: dict[str, Any], directory: str) -> dict[str, Any]:
    """The saving world's task: train the cell at this world's size, then write its full
    checkpoint and the kit's gathering into ``directory``. What Thunder raised taking or saving
    it is written for the resuming world (``rank{r}.json``), which records it as the cell's
    finding; what it raised building or training fails this task, and with it the cell."""
    cell = Cell(**axes)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == cell.world_size, f"the checkpoint is taken at {cell.world_size} ranks, the world has {world}"
    progress.at("building the eager model")
    try:
        parts = recipe(cell, rank_device())
    except Unsupported as exc:  # the cell's own world says so, as its recipe raises the same
        return {"unsupported": str(exc)}
    eager_model = build_eager_model(parts)
    progress.at("setup")
    tm = compose(parts, eager_model).thunder_module
    progress.at("training")
    optimizer = train(parts, eager_model, tm, rank, world).optimizer
    progress.at("taking the checkpoint")
    folder = Path(directory)
    gathered = {
        "state": truth_of("full", eager_model, tm, rank, world),
        "optimizer": _moments(eager_model, tm, optimizer),
    }
    taken: dict[str, str | None] = {"api_error": None, "api_origin": None, "error": None}
    try:
        if parts.composition.parallelism == "torch":
            _save_dcp(tm, optimizer, folder / CHECKPOINT, taken)
        else:
            from thunder.distributed.checkpoint import StateDictOptions
            from thunder.distributed.checkpoint import save as save_checkpoint

            took = take(tm, StateDictOptions(full_state_dict=True, cpu_offload=True), rank)
            taken["api_error"], taken["api_origin"] = took.error, took.origin
            save_checkpoint(took.state, folder / CHECKPOINT)
    except Exception as exc:  # Thunder's own calls (or DCP's over its modules): the resuming world's finding
        taken["error"] = f"{type(exc).__name__}: {exc}"
    (folder / f"rank{rank}.json").write_text(json.dumps(taken))
    if rank == 0:
        torch.save(gathered, folder / GATHERED)
    dist.barrier()
    return {"saved": str(folder)}


def resume_resharded(
    recipe: Recipe, eager_model: EagerModel, tm: Any, optimizer: Any, rank: int, world: int
) -> ScenarioRecord:
    """The resuming world's scenario: the checkpoint the saving world wrote, loaded here and
    resumed beside a composition handed the kit's gathering (``tm`` and ``optimizer``, this
    world's own training, are not what resumes)."""
    assert recipe.checkpoint is not None and recipe.cell.saved_at is not None
    folder = Path(recipe.checkpoint)
    saved_at = recipe.cell.saved_at
    gathered = torch.load(folder / GATHERED, weights_only=True)
    taken = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(saved_at)]
    dcp = recipe.composition.parallelism == "torch"
    # as the same-size resume names them: DCP's checkpoint of FSDP2 is sharded, Thunder's full
    record = (
        Resumed("sharded", taken={}, truth=gathered["state"], taken_by=DCP_TAKEN_BY)
        if dcp
        else Resumed("full", taken={}, truth=gathered["state"])
    )
    record.api_error, record.api_origin = taken[0]["api_error"], taken[0]["api_origin"]
    if errors := [t["error"] for t in taken if t["error"] is not None]:
        record.error = f"taking or saving it at {saved_at} ranks: {errors[0]}"
        return ScenarioRecord("resume", resumed=[record])
    if dcp and record.api_error is not None:  # DCP took nothing: nothing to resume from (as resume_dcp)
        return ScenarioRecord("resume", resumed=[record])
    try:
        load_checkpoint = _load_dcp if dcp else _load_thunders
        fresh, fresh_optimizer = load_checkpoint(recipe, eager_model, folder / CHECKPOINT, record, rank)
        reference = compose(recipe, eager_model).thunder_module
        if dcp:  # as the cell's setup loads a full state dict: broadcast from rank 0
            state = _every_name(gathered["state"], eager_model.module)
            tp.load_full_state_dict(reference.model, state if rank == 0 else {})
        else:
            from thunder.distributed.checkpoint import StateDictOptions, load_model_state_dict

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            load_model_state_dict(clones_to_load(gathered["state"]), reference, options, rank)
        reference_optimizer = OPTIMIZERS["AdamW"].make(reference.parameters())
        _hand_moments(reference_optimizer, reference, gathered["optimizer"], rank, world)
        if not dcp:  # Thunder offers no optimizer checkpoint: the kit's resharding for both
            _hand_moments(fresh_optimizer, fresh, gathered["optimizer"], rank, world)
        modules, optimizers = (fresh, reference), [fresh_optimizer, reference_optimizer]
        resumed_beside(record, recipe, eager_model, modules, optimizers, {}, set(), rank, world)
    except Exception as exc:  # Thunder's own calls: what it raises is a finding, not the end of the cell
        record.error = f"{type(exc).__name__}: {exc}"
    return ScenarioRecord("resume", resumed=[record])


def _load_thunders(recipe: Recipe, eager_model: EagerModel, path: Path, record: Resumed, rank: int) -> tuple[Any, Any]:
    """A fresh composition with Thunder's full checkpoint at ``path`` loaded (what was read
    into ``record.taken``), and a fresh AdamW for it."""
    from thunder.distributed.checkpoint import StateDictOptions, load, load_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    fresh = compose(recipe, eager_model).thunder_module
    template = clones_to_load(take(fresh, options, rank).state)
    load(template, path)
    record.taken = local_copies(template)
    load_model_state_dict(template, fresh, options, rank)
    return fresh, OPTIMIZERS["AdamW"].make(fresh.parameters())


def _every_name(state: Tensors, module: torch.nn.Module) -> Tensors:
    """``state`` (one name per tied group, as the kit gathers) under every name ``module``'s
    state dict has, a tied weight's each given its value (as DCP's full state dict wants)."""
    named = module.state_dict(keep_vars=True)
    first = {t.data_ptr(): n for n, t in named.items() if n in state}
    return {n: state[first[t.data_ptr()]].clone() for n, t in named.items() if t.data_ptr() in first}


def _save_dcp(tm: Any, optimizer: Any, path: Path, taken: dict[str, str | None]) -> None:
    """DCP's sharded checkpoint of the model and its AdamW at ``path`` (``resume_dcp``'s)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    try:
        model_state, optimizer_state = get_state_dict(tm.model, optimizer)
    except Exception as exc:  # DCP over a model holding ThunderModules: a finding, named
        taken["api_error"], taken["api_origin"] = f"{type(exc).__name__}: {exc}", origin(exc)
        return
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path))


def _load_dcp(recipe: Recipe, eager_model: EagerModel, path: Path, record: Resumed, rank: int) -> tuple[Any, Any]:
    """A fresh composition and its AdamW, DCP's checkpoint at ``path`` loaded into both (DCP
    reshards what another world size saved); what it read into ``record.taken``, whole."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    fresh = compose(recipe, eager_model).thunder_module
    fresh_optimizer = OPTIMIZERS["AdamW"].make(fresh.parameters())
    model_target, optimizer_target = get_state_dict(fresh.model, fresh_optimizer)
    target = {"model": model_target, "optimizer": optimizer_target}
    dcp.load(target, checkpoint_id=str(path))
    record.taken = whole(target["model"])
    set_state_dict(fresh.model, fresh_optimizer, model_state_dict=target["model"], optim_state_dict=target["optimizer"])
    return fresh, fresh_optimizer


def _moments(eager_model: EagerModel, tm: Any, optimizer: Any) -> Tensors:
    """AdamW's state by "<parameter> <key>" under eager's names: each moment gathered whole
    from this world's shards (it is shaped as its parameter's shard), the step as it is."""
    from torch.distributed.tensor import DTensor

    out: Tensors = {}
    world = dist.get_world_size()
    for name, shape in eager_model.shapes.items():
        state = optimizer.state.get(tm.get_parameter(name), {})
        for key, value in sorted(state.items()):
            if isinstance(value, DTensor):  # FSDP2's moments: DTensor's own collective
                value = value.full_tensor()
            elif (value := torch.as_tensor(value)).dim() > 0:
                # a moment not shaped as its parameter's shard (or unreadable) is gathered as
                # NaN, so the ranks still issue the same collective and the resume names it
                local = local_shape(shape, world, replicated=False)
                if tuple(value.shape) != local or value.is_meta:
                    value = torch.full(local, float("nan"), dtype=torch.float32, device=rank_device())
                value = unshard(value, shape)
            out[f"{name} {key}"] = value.detach().cpu().clone()
    return out


def _hand_moments(optimizer: Any, module: Any, moments: Tensors, rank: int, world: int) -> None:
    """``moments`` (``_moments``' whole ones) into ``optimizer``'s state, each cut into this
    rank's shard of this world as its parameter is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for named, value in moments.items():
        name, key = named.split(" ", 1)
        p = module.get_parameter(name)
        if value.dim() == 0:
            piece = value.clone()
        elif isinstance(p, DTensor):  # FSDP2's: laid out as its parameter is
            piece = distribute_tensor(value.to(p.device, p.dtype), p.device_mesh, p.placements)
        else:
            piece = shard(value, rank, world).to(p.device, p.dtype)
        optimizer.state[p][key] = piece

"""``resume`` under PyTorch's parallelism: the checkpoint a user of FSDP2 or DDP takes, through
``torch.distributed.checkpoint`` (DCP): ``get_state_dict`` of the model and its optimizer (under
FSDP2 each rank's DTensor shards, a sharded checkpoint; under DDP whole tensors, a full one),
``dcp.save`` to a directory every rank shares, then a fresh composition of the same cell with
its own AdamW, ``dcp.load`` into their state dicts and ``set_state_dict``. What the checkpoint
holds (gathered whole) is compared with the kit's own gathering, and the resumed module must
then go on bit for bit where the uninterrupted one goes (``resume.resumed_beside``).

What DCP raises on a model holding ThunderModules is recorded as Thunder's finding: the call
that raised, and the round trip ends there.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.checkpoint_record import Resumed
from conformance.checks.record import ScenarioRecord
from conformance.rank.build import EagerModel, Recipe, compose
from conformance.rank.gather import cpu_copies
from conformance.rank.raised import origin
from conformance.rank.scenarios.resume import resumed_beside, shared_directory, truth_of, unlike_on_ranks
from fixtures.optimizers import OPTIMIZERS

TAKEN_BY = "torch.distributed.checkpoint.state_dict.get_state_dict"


def resume_dcp(
    recipe: Recipe, eager_model: EagerModel, under_test: Any, optimizer: Any, rank: int, world: int
) -> ScenarioRecord:
    kind = "full" if eager_model.replicated else "sharded"
    directory = shared_directory()
    try:
        resumed = _round_trip(kind, recipe, eager_model, under_test, optimizer, rank, world, directory / kind)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    return ScenarioRecord("resume", resumed=[resumed])


def _round_trip(
    kind: str, recipe: Recipe, eager_model: EagerModel, tm: Any, optimizer: Any, rank: int, world: int, path: Path
) -> Resumed:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    try:
        model_state, optimizer_state = get_state_dict(tm.model, optimizer)
    except Exception as exc:  # DCP over a model holding ThunderModules: a finding, named
        api_error = f"{type(exc).__name__}: {exc}"
        return Resumed(kind, taken={}, truth={}, api_error=api_error, api_origin=origin(exc), taken_by=TAKEN_BY)
    record = Resumed(
        kind, taken=whole(model_state), truth=truth_of("full", eager_model, tm, rank, world), taken_by=TAKEN_BY
    )
    unlike = unlike_on_ranks(tm)
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path))
        fresh = compose(recipe, eager_model).thunder_module
        # the fresh module's optimizer first, made as training makes it, as a training script
        # builds both and then restores
        fresh_optimizer = OPTIMIZERS["AdamW"].make(fresh.parameters())
        model_target, optimizer_target = get_state_dict(fresh.model, fresh_optimizer)
        target = {"model": model_target, "optimizer": optimizer_target}
        dcp.load(target, checkpoint_id=str(path))
        set_state_dict(
            fresh.model, fresh_optimizer, model_state_dict=target["model"], optim_state_dict=target["optimizer"]
        )
        loaded = {n: t for n, t in whole(target["model"]).items() if n in unlike}
        optimizers = [fresh_optimizer, optimizer]
        resumed_beside(record, recipe, eager_model, (fresh, tm), optimizers, loaded, unlike, rank, world)
    except Exception as exc:  # Thunder's modules under DCP: what it raises is a finding, not the end of the cell
        record.error = f"{type(exc).__name__}: {exc}"
    return record


def whole(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """CPU copies of a state dict's tensors, a DTensor gathered whole (every rank calls this
    with the same keys in the same order, as DCP's state dicts have them)."""
    from torch.distributed.tensor import DTensor

    tensors = ((n, v) for n, v in state.items() if isinstance(v, torch.Tensor))
    return cpu_copies((n, v.full_tensor() if isinstance(v, DTensor) else v) for n, v in tensors)

"""The full checkpoint with ``StateDictOptions(rank0_only=True)``, part of ``resume``: how a
training script keeps one copy of the weights, on rank 0.

Thunder's contract (``thunder/distributed/checkpoint.py``): taking it, rank 0 gets the whole
state dict and every other rank an empty one; loading it, rank 0 loads what it is given and
every other rank, given nothing (as such a script gives them), keeps its own tensors. Thunder
does not broadcast rank 0's (a TODO there); one that does would give them the checkpoint's,
and the check accepts that too. A fresh composition takes the load (no compile: it is never
called), so the uninterrupted module is not disturbed.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.checks.checkpoint_record import RankZeroOnly
from conformance.rank.build import EagerModel, Recipe, compose
from conformance.rank.gather import local_copies, padding_cleared, shard
from conformance.rank.raised import origin

Tensors = dict[str, torch.Tensor]


def rank0_only(recipe: Recipe, eager_model: EagerModel, tm: Any, truth: Tensors, rank: int, world: int) -> RankZeroOnly:
    """Take ``tm``'s full checkpoint and load ``truth`` (what it must hold, the kit's own
    gathering) into a fresh composition, both with ``rank0_only=True``."""
    from thunder.distributed.checkpoint import StateDictOptions, get_model_state_dict, load_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, rank0_only=True)
    checkpoint = _as_held(truth, eager_model, rank, world)
    record = RankZeroOnly(rank=rank, truth=truth, checkpoint=checkpoint)
    try:
        record.taken = local_copies(get_model_state_dict(tm, options, rank))
    except Exception as exc:  # its own finding: rank0_only may raise where the full checkpoint does not
        record.take_error, record.take_origin = f"{type(exc).__name__}: {exc}", origin(exc)
    try:
        fresh = compose(recipe, eager_model).thunder_module
        record.untouched = _held(fresh, checkpoint, eager_model, rank)
        given = {n: t.clone() for n, t in truth.items()} if rank == 0 else {}
        load_model_state_dict(given, fresh, options, rank)
        record.loaded = _held(fresh, checkpoint, eager_model, rank)
    except Exception as exc:  # Thunder's own calls: a finding
        record.error = f"{type(exc).__name__}: {exc}"
    return record


def _as_held(truth: Tensors, eager_model: EagerModel, rank: int, world: int) -> Tensors:
    """What this rank's module holds once ``truth`` is loaded into it: the whole tensors under
    DDP, this rank's padded shard of each parameter under FSDP (buffers are replicated)."""
    if eager_model.replicated:
        return dict(truth)
    return {n: shard(t, rank, world) if n in eager_model.shapes else t for n, t in truth.items()}


def _held(fresh: Any, checkpoint: Tensors, eager_model: EagerModel, rank: int) -> Tensors:
    """This rank's tensors of ``fresh`` (local shards under FSDP, padding rows zeroed)."""
    held = local_copies(fresh.state_dict())
    if eager_model.replicated:
        return held
    return {n: padding_cleared(t, checkpoint.get(n), eager_model.shapes.get(n), rank) for n, t in held.items()}

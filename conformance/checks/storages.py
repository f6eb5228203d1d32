"""The eager model's parameter storages, as sharding sees them: a tied weight is one storage
however many names it has, and dim 0 is padded up to a multiple of the world size."""

from __future__ import annotations

from typing import Any

import torch


def distinct_storages(module: torch.nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """One (first) name and parameter per distinct storage, in registration order."""
    seen: dict[Any, tuple[str, torch.Tensor]] = {}
    for name, p in module.named_parameters():  # already one entry per tied group
        if trainable_only and not p.requires_grad:
            continue
        storage = p.untyped_storage()
        # meta tensors (a simulated world's model) have no data: each Parameter is its own
        key = (storage.data_ptr(), storage.nbytes()) if storage.nbytes() and not p.is_meta else id(p)
        seen.setdefault(key, (name, p))
    return dict(seen.values())


def padded_bytes(p: torch.Tensor, world_size: int) -> int:
    """Bytes of the all-gathered tensor: dim 0 padded up to a multiple of the world size."""
    rows = -(-p.shape[0] // world_size) * world_size if p.dim() else 1
    return rows * (p.numel() // max(p.shape[0], 1) if p.dim() else 1) * p.element_size()


def shard_bytes(module: torch.nn.Module, world_size: int) -> int:
    """Bytes of one rank's shards: every distinct storage, dim 0 padded, over the world size."""
    return sum(padded_bytes(p, world_size) for p in distinct_storages(module).values()) // world_size


def tie_groups(module: torch.nn.Module) -> list[list[str]]:
    """The names of every parameter that has more than one."""
    groups: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def tied_duplicates(module: torch.nn.Module) -> set[str]:
    """Names of a tied parameter after its first: what state dicts of sharded modules leave out."""
    return {n for n, _ in module.named_parameters(remove_duplicate=False)} - {n for n, _ in module.named_parameters()}

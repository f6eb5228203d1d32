"""The eager model's parameter storages, as sharding sees them: a tied weight is one storage
however many names it has, and dim 0 is padded up to a multiple of the world size. And what
one allocation of so many bytes reads as on a device (``allocated_bytes``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from fixtures import patterns

# The CUDA caching allocator rounds every request up to a multiple of 512 bytes (kMinBlockSize,
# ``round_size`` in c10/cuda/CUDACachingAllocator.cpp) and its statistics, which the kit reads
# (``memory_allocated``, ``max_memory_allocated``), add the size of the block handed out
# (``update_stat_array(stats.allocated_bytes, block->size, ...)`` in its ``malloc``), not the
# bytes asked for.
CUDA_BLOCK_BYTES = 512
# Requests above this come from the large pool, whose cached blocks are split only where more
# than this would remain (``should_split``: ``remaining > kSmallSize``) unless
# expandable_segments is on: such a reading may exceed the rounded request by up to 1 MiB.
CUDA_SMALL_POOL_BYTES = 1 << 20


def allocated_bytes(nbytes: int, device: torch.device | str) -> int:
    """What one allocation of ``nbytes`` adds to the kit's reading of ``device``: the bytes
    themselves off CUDA (the CPU tracker counts storages exactly); on CUDA the allocator's
    block, ``nbytes`` rounded up to 512 (nothing for 0 bytes: an empty tensor allocates no
    block). Exact on CUDA up to 1 MiB; above it, a lower bound (see CUDA_SMALL_POOL_BYTES).
    PYTORCH_CUDA_ALLOC_CONF's roundup_power2_divisions, off by default, is not modelled."""
    if torch.device(device).type != "cuda" or nbytes <= 0:
        return nbytes
    return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def allocations(sizes: Iterable[int], device: torch.device | str) -> int:
    """Bytes of tensors allocated one each: their sum, each rounded on CUDA. Where one buffer
    holds several (a bucket), this is an upper bound: rounding the sum rounds up less."""
    return sum(allocated_bytes(n, device) for n in sizes)


def piece_bytes(nbytes: int, world_size: int, device: torch.device | str) -> int:
    """One rank's piece of a tensor of ``nbytes`` (dim 0 already padded), as an allocation.
    On CUDA rounded up, never to 0: a 0-d tensor, which cannot be cut, is kept whole."""
    if torch.device(device).type != "cuda":
        return nbytes // world_size
    return allocated_bytes(-(-nbytes // world_size), device)


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
    return padded_shape_bytes(tuple(p.shape), p.element_size(), world_size)


def padded_shape_bytes(shape: tuple[int, ...] | list[int], element_size: int, world_size: int) -> int:
    """``padded_bytes`` of a tensor known by its shape and element size (a 0-d one is whole)."""
    if not shape:
        return element_size
    return patterns.padded_rows(shape[0], world_size) * math.prod(shape[1:]) * element_size


def shard_bytes(
    module: torch.nn.Module, world_size: int, device: torch.device | str = "cpu", trainable_only: bool = False
) -> int:
    """Bytes of one rank's shards: every distinct storage, dim 0 padded, over the world size.
    On CUDA each shard is its own allocation, rounded (``allocated_bytes``)."""
    padded = [padded_bytes(p, world_size) for p in distinct_storages(module, trainable_only).values()]
    if torch.device(device).type != "cuda":
        # summed, then divided: the exact CPU numbers the kit pins are computed so
        return sum(padded) // world_size
    return sum(piece_bytes(n, world_size, device) for n in padded)


def tie_groups(module: torch.nn.Module) -> list[list[str]]:
    """The names of every parameter that has more than one."""
    groups: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def tied_duplicates(module: torch.nn.Module) -> set[str]:
    """Names of a tied parameter after its first: what state dicts of sharded modules leave out."""
    return {n for n, _ in module.named_parameters(remove_duplicate=False)} - {n for n, _ in module.named_parameters()}

"""PyTorch DDP's collectives, derived from the model: what ``DistributedDataParallel`` must
issue at the process group in each phase of a training step, for a model composed as
fixtures/torch_parallel.py composes it (DDP's defaults, on a group that counts every collective,
its reducer's and its buffer broadcasts in C++ included).

- **Backward**: per synced backward, one all-reduce per gradient bucket, of its gradients'
  bytes (unpadded): the buckets as DDP assigns the trainable storages (torch's own
  ``_compute_bucket_assignment_by_size``, in reverse registration order, one dtype per
  bucket). The first backward packs them without a size limit (DDP without
  ``find_unused_parameters``); from the second on, DDP has rebuilt them under its caps (the
  first bucket 1 MiB, the others 25 MiB) in the order the gradients arrived, which for these
  models is the reverse registration order.
- **Forward**: where the model has buffers, rank 0's are broadcast before each forward that
  follows a synced one (or none: the first), coalesced as ``_broadcast_coalesced`` packs them
  (one flat broadcast per dtype, up to DDP's 250 MiB). The forward of the second step, where
  DDP rebuilds its buckets, first broadcasts rank 0's assignment: the parameters' bucket
  indices and the bucket count (one int32 each), then each bucket's size.
- Nothing in the optimizer step. Thunder compiles the module DDP wraps (or DDP itself) and
  must add nothing.
"""

from __future__ import annotations

import sys

import torch

from conformance.checks.fsdp2 import PHASES, Expected
from conformance.checks.storages import distinct_storages

# DDP's reduction bucket cap when ``bucket_cap_mb`` is left unset, as the compositions leave it
BUCKET_CAP_BYTES = 25 * 1024 * 1024
# DDP's cap on one coalesced broadcast of its buffers (``DistributedDataParallel.broadcast_bucket_size``)
BROADCAST_CAP_BYTES = 250 * 1024 * 1024
INT32_BYTES = 4


def reducer_buckets(model: torch.nn.Module, step: int) -> list[int]:
    """The bytes of each bucket DDP all-reduces in step ``step``'s backward."""
    import torch.distributed as dist

    trainable = list(reversed(list(distinct_storages(model, trainable_only=True).values())))
    if not trainable:
        return []
    limits = [sys.maxsize] if step == 0 else [dist._DEFAULT_FIRST_BUCKET_BYTES, BUCKET_CAP_BYTES]
    assigned, _ = dist._compute_bucket_assignment_by_size(trainable, limits)
    return [sum(trainable[i].numel() * trainable[i].element_size() for i in bucket) for bucket in assigned]


def buffer_broadcasts(model: torch.nn.Module) -> list[int]:
    """The bytes of each coalesced broadcast of the model's buffers before a forward."""
    import torch.distributed as dist

    buffers = list(dict.fromkeys(model.buffers()))  # DDP's: each tensor once
    if not buffers:
        return []
    assigned, _ = dist._compute_bucket_assignment_by_size(buffers, [BROADCAST_CAP_BYTES])
    return [sum(buffers[i].numel() * buffers[i].element_size() for i in bucket) for bucket in assigned]


def rebuild_broadcasts(model: torch.nn.Module) -> list[int]:
    """The bytes of what rank 0 broadcasts as DDP rebuilds its buckets: every trainable
    storage's bucket index and the bucket count, then each bucket's size (int32s)."""
    trainable = len(distinct_storages(model, trainable_only=True))
    if not trainable:
        return []
    return [(trainable + 1) * INT32_BYTES, len(reducer_buckets(model, 1)) * INT32_BYTES]


def expected(model: torch.nn.Module, step: int) -> dict[str, dict[str, Expected]]:
    """Phase -> kind -> what training step ``step`` issues at the process group (kinds not
    named: none). Every step's forward follows a synced one, or none."""
    sizes = reducer_buckets(model, step)
    broadcasts = (rebuild_broadcasts(model) if step == 1 else []) + buffer_broadcasts(model)
    want: dict[str, dict[str, Expected]] = {phase: {} for phase in PHASES}
    if broadcasts:
        want["forward"]["broadcast"] = Expected(len(broadcasts), sum(broadcasts))
    if sizes:
        want["backward"]["all_reduce"] = Expected(len(sizes), sum(sizes))
    return want

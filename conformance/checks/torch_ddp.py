"""PyTorch DDP's collectives, derived from the model: what ``DistributedDataParallel``'s reducer
must all-reduce in each phase of a training step, for a model composed as
fixtures/torch_parallel.py composes it (DDP's defaults, PyTorch's own ``allreduce_hook`` as its
communication hook: the documented Python twin of the built-in all-reduce, through which the
count at the process group sees each bucket).

Per synced backward, one all-reduce per gradient bucket, of its gradients' bytes (unpadded):
the buckets as DDP assigns the trainable storages (torch's own
``_compute_bucket_assignment_by_size``, in reverse registration order, one dtype per bucket).
The first backward packs them without a size limit (DDP without ``find_unused_parameters``);
from the second on, DDP has rebuilt them under its caps (the first bucket 1 MiB, the others
25 MiB) in the order the gradients arrived, which for these models is the reverse registration
order. Nothing in the forward that the count sees: DDP's buffer broadcasts, like its
construction's, go through C++'s ``_broadcast_coalesced`` beneath the Python API. Nothing in
the optimizer step. Thunder compiles the module DDP wraps (or DDP itself) and must add nothing.
"""

from __future__ import annotations

import sys

import torch

from conformance.checks.fsdp2 import PHASES, Expected
from conformance.checks.storages import distinct_storages

# DDP's reduction bucket cap when ``bucket_cap_mb`` is left unset, as the compositions leave it
BUCKET_CAP_BYTES = 25 * 1024 * 1024


def reducer_buckets(model: torch.nn.Module, step: int) -> list[int]:
    """The bytes of each bucket DDP all-reduces in step ``step``'s backward."""
    import torch.distributed as dist

    trainable = list(reversed(list(distinct_storages(model, trainable_only=True).values())))
    if not trainable:
        return []
    limits = [sys.maxsize] if step == 0 else [dist._DEFAULT_FIRST_BUCKET_BYTES, BUCKET_CAP_BYTES]
    assigned, _ = dist._compute_bucket_assignment_by_size(trainable, limits)
    return [sum(trainable[i].numel() * trainable[i].element_size() for i in bucket) for bucket in assigned]


def expected(model: torch.nn.Module, step: int) -> dict[str, dict[str, Expected]]:
    """Phase -> kind -> what training step ``step`` issues at the process group (kinds not named: none)."""
    sizes = reducer_buckets(model, step)
    want: dict[str, dict[str, Expected]] = {phase: {} for phase in PHASES}
    if sizes:
        want["backward"]["all_reduce"] = Expected(len(sizes), sum(sizes))
    return want

"""Buckets as the model's structure and the cell's bucketing imply them: FSDP's (one per
distinct parameter storage without bucketing; LAYER: the storages of one module; BLOCK: those
under one numbered child of a module list) and DDP's (its documented packing of gradients by
``bucket_size_in_mb``). What the collectives area counts and the memory area's buffers and
gathered units are built from, never read from a trace."""

from __future__ import annotations

import torch

from conformance.checks.storages import distinct_storages
from fixtures.compositions import DDP_DEFAULTS


def bucket_of(name: str, bucketing: str) -> str:
    path = name.split(".")
    if bucketing == "layer":
        return ".".join(path[:-1])
    if bucketing == "block":
        numbered = [i for i, part in enumerate(path) if part.isdigit()]
        return ".".join(path[: numbered[0] + 1]) if numbered else name
    return name


def buckets(module: torch.nn.Module, bucketing: str, trainable_only: bool = False) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in distinct_storages(module, trainable_only):
        out.setdefault(bucket_of(name, bucketing), []).append(name)
    return out


# DDP's ``bucket_size_in_mb`` per bucketing value (the axis is FSDP's; for DDP it names a
# bucket size): ``none`` 0, each gradient all-reduced alone and in place; ``block`` Thunder's
# default, 25 MB (the kit's CPU models fit one bucket per dtype); ``layer`` the largest
# trainable gradient's size, so that a model's gradients fill several buckets and the
# packing's boundaries are exercised.
def ddp_bucket_mb(module: torch.nn.Module, bucketing: str) -> float:
    if bucketing == "none":
        return 0.0
    if bucketing == "block":
        return DDP_DEFAULTS["bucket_size_in_mb"]
    largest = max((_nbytes(p) for p in distinct_storages(module, trainable_only=True).values()), default=0)
    return largest / 2**20  # exact: a division by a power of two


def ddp_buckets(module: torch.nn.Module, bucketing: str) -> list[list[str]]:
    """The buckets DDP packs the trainable gradients into, as its documentation states the
    rule: per dtype, in the parameters' order, a bucket closes once it holds at least
    ``bucket_size_in_mb``, and what is left at the end is one more; with a size of 0, one
    gradient each (all-reduced in place)."""
    storages = distinct_storages(module, trainable_only=True)
    cap = ddp_bucket_mb(module, bucketing) * 2**20
    if cap <= 0:
        return [[n] for n in storages]
    by_dtype: dict[torch.dtype, list[str]] = {}
    for n, p in storages.items():
        by_dtype.setdefault(p.dtype, []).append(n)
    out: list[list[str]] = []
    for names in by_dtype.values():
        current: list[str] = []
        held = 0
        for n in names:
            current.append(n)
            held += _nbytes(storages[n])
            if held >= cap:
                out.append(current)
                current, held = [], 0
        if current:
            out.append(current)
    return out


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()

"""Collectives: what Thunder put into its final forward and backward execution traces,
counted through bound symbols, against what the model's structure implies.

Expectations come from the eager reference model: one all-gather per bucket in the forward,
one reduce-scatter per bucket of trainable storages in the backward, a re-gather of every
bucket in the backward only under ZERO3, and no all-reduce anywhere. Without bucketing a
bucket is one distinct parameter storage (a tied weight is one storage, however many names
it has); LAYER puts the storages of one module together, BLOCK those under one numbered
child of a module list (a transformer block), each other storage alone.
"""

from __future__ import annotations

import collections
import functools
from typing import TYPE_CHECKING, Any

import torch

from conformance.findings import Findings

if TYPE_CHECKING:
    from conformance.execute import CellRun

KINDS = ("all_gather", "reduce_scatter", "all_reduce")


@functools.cache
def _symbol_kinds() -> dict[Any, str]:
    """Symbol ids of each collective: the distributed prim and the torch executor's impl."""
    import thunder.executors.torchex as torchex
    from thunder.distributed.prims import PrimIDs

    return {
        PrimIDs.ALL_GATHER: "all_gather",
        torchex.all_gather_prim_impl.id: "all_gather",
        PrimIDs.REDUCE_SCATTER: "reduce_scatter",
        torchex.reduce_scatter_prim_impl.id: "reduce_scatter",
        PrimIDs.ALL_REDUCE: "all_reduce",
        torchex.all_reduce_prim_impl.id: "all_reduce",
    }


def collective_symbols(trace: Any) -> dict[str, list[Any]]:
    """Top-level bound symbols of ``trace`` by collective kind (their sub-symbols would
    count one collective twice)."""
    found: dict[str, list[Any]] = {k: [] for k in KINDS}
    kinds = _symbol_kinds()
    for bsym in trace.bound_symbols:
        kind = kinds.get(bsym.sym.id)
        if kind is not None:
            found[kind].append(bsym)
    return found


def distinct_storages(module: torch.nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """One (first) name and parameter per distinct storage, in registration order."""
    seen: dict[Any, tuple[str, torch.Tensor]] = {}
    for name, p in module.named_parameters():  # already one entry per tied group
        if trainable_only and not p.requires_grad:
            continue
        storage = p.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes()) if storage.nbytes() else id(p)
        seen.setdefault(key, (name, p))
    return dict(seen.values())


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


def padded_bytes(p: torch.Tensor, world_size: int) -> int:
    """Bytes of the all-gathered tensor: dim 0 padded up to a multiple of the world size."""
    rows = -(-p.shape[0] // world_size) * world_size if p.dim() else 1
    return rows * (p.numel() // max(p.shape[0], 1) if p.dim() else 1) * p.element_size()


def expected_counts(module: torch.nn.Module, sharding: str, bucketing: str) -> dict[str, dict[str, int]]:
    storages = len(buckets(module, bucketing))
    trainable = len(buckets(module, bucketing, trainable_only=True))
    return {
        "forward": {"all_gather": storages, "reduce_scatter": 0, "all_reduce": 0},
        "backward": {
            "all_gather": storages if sharding == "zero3" else 0,
            "reduce_scatter": trainable,
            "all_reduce": 0,
        },
    }


def _output_bytes(bsym: Any) -> int:
    out = bsym.flat_proxy_outs[0]
    numel = 1
    for d in out.shape:
        numel *= d
    return numel * out.dtype.bytes


def check(run: CellRun) -> Findings:
    import thunder

    found = Findings()
    cell = run.cell
    traces = {
        "forward": thunder.last_traces(run.thunder_module)[-1],
        "backward": thunder.last_backward_traces(run.thunder_module)[-1],
    }
    expected = expected_counts(run.reference, cell.sharding, cell.bucketing)
    for phase, trace in traces.items():
        symbols = collective_symbols(trace)
        for kind in KINDS:
            found.equal(f"{phase} {kind}s", len(symbols[kind]), expected[phase][kind])
        gathered = collections.Counter(b.flat_proxy_args[0].name for b in symbols["all_gather"])
        twice = sorted(name for name, n in gathered.items() if n > 1)
        with found.expect(f"{phase} gathers each storage once"):
            assert not twice, f"gathered more than once: {twice}"
    forward_gathers = collective_symbols(traces["forward"])["all_gather"]
    found.equal(
        "forward all-gathered bytes",
        sum(_output_bytes(b) for b in forward_gathers),
        sum(padded_bytes(p, run.cell.world_size) for p in distinct_storages(run.reference).values()),
    )
    return found

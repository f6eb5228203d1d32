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

import torch

from conformance.checks.area import Area
from conformance.checks.findings import Findings
from conformance.checks.record import CellRecord
from conformance.checks.storages import distinct_storages, padded_bytes
from conformance.checks.traces import KINDS, collective_symbols, final_traces
from transforms.policies import proxy_bytes


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


def check(run: CellRecord) -> Findings:
    found = Findings()
    cell = run.cell
    symbols = {phase: collective_symbols(t) for phase, t in final_traces(run.thunder_module).by_phase().items()}
    expected = expected_counts(run.reference, cell.sharding, cell.bucketing)
    for phase, found_in in symbols.items():
        for kind in KINDS:
            found.equal(f"{phase} {kind}s", len(found_in[kind]), expected[phase][kind])
        gathered = collections.Counter(b.flat_proxy_args[0].name for b in found_in["all_gather"])
        twice = sorted(name for name, n in gathered.items() if n > 1)
        with found.expect(f"{phase} gathers each storage once"):
            assert not twice, f"gathered more than once: {twice}"
    forward_gathers = symbols["forward"]["all_gather"]
    found.equal(
        "forward all-gathered bytes",
        sum(proxy_bytes(b.flat_proxy_outs[0]) for b in forward_gathers),
        sum(padded_bytes(p, run.cell.world_size) for p in distinct_storages(run.reference).values()),
    )
    return found


AREA = Area("collectives", check)

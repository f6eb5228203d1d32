"""Simulated worlds: one process acts as one rank of a world of any size, under torch's fake
process group (collectives return at once and move nothing).

A simulated cell runs on a world of ``SAMPLED`` processes (conformance/matrix/simulated.py)
launched without a process group (the world's ``NO_GROUP``); for each cell,
process ``i`` joins a fake group of the cell's world size as the ``i``-th sampled rank: the
ends, 2, 10 and a prime near a third (``sampled_ranks`` says why these).
The model is built on the meta device with its weights in the row pattern
(fixtures/patterns.py), composed as a real cell is, then runs one forward and backward so
that Thunder's final traces exist. Only shards are ever real.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from conformance.checks.findings import CellResult, judged
from conformance.checks.record import SimulatedMemory, SimulatedRecord
from conformance.checks.registry import AREAS, applies
from conformance.checks.traces import final_traces
from conformance.matrix.cells import Cell
from conformance.matrix.simulated import sampled_ranks
from conformance.rank import measure, progress
from conformance.rank.build import EagerModel, Unsupported, compose, eager_module_inits, recipe

DEVICE = torch.device("cpu")  # shards are real, on the CPU, whatever the session's backend


@contextlib.contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    """This process as ``rank`` of ``world_size`` under the fake backend, for the block."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_simulated(cell: Cell, declared: frozenset[str] = frozenset()) -> CellResult:
    """Every applicable area's findings on the sampled rank this process stands for."""
    rank = sampled_ranks(cell.world_size)[int(os.environ["RANK"])]
    areas = [area for name, area in AREAS.items() if applies(cell, name)]
    with fake_world(rank, cell.world_size):
        try:
            run = drive(cell, rank, declared)
        except Unsupported as exc:
            return CellResult(unsupported=str(exc))
        return CellResult({area.name: judged(area.simulated, run) for area in areas}, run.timings)


def drive(cell: Cell, rank: int, declared: frozenset[str] = frozenset()) -> SimulatedRecord:
    """Build the cell on the meta device, compose it, run one forward and backward."""
    parts = recipe(cell, DEVICE)
    with torch.device("meta"):
        meta = parts.make().to(parts.dtype)
    eager_model = EagerModel(
        module=meta, shapes={n: p.shape for n, p in meta.named_parameters()}, initial={}, setup_peak=0
    )
    progress.at("setup")
    composed = compose(parts, eager_model)
    tm = composed.thunder_module
    progress.at("forward and backward")
    alive = measure.census(DEVICE, set())
    began = time.perf_counter()
    generator = torch.Generator().manual_seed(rank)
    out = tm(parts.fixture.make_input(generator, parts.dtype))
    out.float().sum().backward()  # the fake group's gathers hold garbage: only the traces matter
    return SimulatedRecord(
        cell=cell,
        rank=rank,
        eager_model=meta,
        thunder_module=tm,
        memory=SimulatedMemory(
            setup_peak=composed.setup_peak,
            alive_after_setup=alive.nbytes,
            scalars_after_setup=alive.scalars,
            module_inits=eager_module_inits(parts, DEVICE) if parts.init.on_meta else [],
        ),
        timings={"setup_s": composed.setup_s, "step0_s": time.perf_counter() - began},
        traces=final_traces(tm),
        declared=declared,
    )

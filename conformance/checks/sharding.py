"""Sharding: what each sampled rank of a simulated world holds of every parameter.

Expected from the model and the world size alone: FSDP shards dim 0, padded up to a multiple
of the world size N and cut in N, so every rank holds ``chunk = ceil(D / N)`` rows (the same
on every rank, which keeps collectives uniform), of which rank r's first
``clamp(D - r * chunk, 0, chunk)`` are rows ``r * chunk ..`` of the parameter and the rest
padding. At world sizes near D the last ranks hold partial shards, past it only padding.
The model's weights are in the row pattern (fixtures/patterns.py), so a shard's values say
which rows it holds: a wrong offset, a shard cut from the unpadded tensor, a padding rounded
the wrong way all show as rows that are not the expected ones. Padding rows are not read
(Thunder leaves them uninitialized).

Under tensor parallelism (a real world), what every rank holds of every parameter: the DTensor
placements the plan implies on a mesh of every rank, and the shape each rank holds, derived
from the plan, eager's shapes and the world size (checks/megatron.py); a parameter the plan
leaves alone stays a plain, whole tensor.
"""

from __future__ import annotations

import math

import torch

from conformance.checks import megatron
from conformance.checks.area import Area
from conformance.checks.findings import Findings
from conformance.checks.record import SimulatedRecord, TensorParallelRecord
from conformance.checks.storages import distinct_storages, shard_bytes
from fixtures import patterns


def _describe_rows(values: torch.Tensor) -> str:
    """What rows of the pattern ``values`` (one value per row) are, for a message."""
    finite = values[torch.isfinite(values)]
    if finite.numel() != values.numel() or not torch.equal(finite, finite.round()):
        return "values that are no rows of the parameter"
    first, last = int(values[0].item()), int(values[-1].item())
    return f"rows {first}..{last}" if values.numel() > 1 else f"row {first}"


def check(run: SimulatedRecord) -> Findings:
    found = Findings()
    world, rank = run.cell.world_size, run.rank
    tm = run.thunder_module
    for name, full in distinct_storages(run.eager_model).items():
        chunk = patterns.chunk_rows(full.shape[0], world)
        want_shape = (chunk, *full.shape[1:])
        with found.expect("sharding.shard", f"shard [{name}]", name=name):
            try:
                got = tm.get_parameter(name)
            except AttributeError:
                raise AssertionError("the Thunder module has no such parameter") from None
            assert tuple(got.shape) == want_shape, (
                f"shape {tuple(got.shape)}, expected {want_shape} "
                f"(dim 0 of {full.shape[0]} padded to a multiple of {world}, cut in {world})"
            )
            assert got.dtype == full.dtype, f"dtype {got.dtype}, expected {full.dtype}"
            assert got.device.type != "meta", "still on the meta device: never materialized"
            rows = patterns.held_rows(full.shape[0], world, rank)
            if not rows:  # a shard of padding only (the last ranks, where dim 0 < world size)
                continue
            held = got.detach()[: len(rows)].reshape(len(rows), -1)
            want = patterns.rows(rows.start, len(rows), (len(rows), 1), got.dtype).reshape(len(rows), -1)
            if not torch.equal(held, want.expand_as(held)):
                raise AssertionError(
                    f"holds {_describe_rows(held[:, 0])} in its first {len(rows)} rows, "
                    f"expected rows {rows.start}..{rows.stop - 1}"
                )
    held_bytes = sum(p.numel() * p.element_size() for p in tm.parameters())
    found.equal("sharding.bytes", "shard bytes", held_bytes, shard_bytes(run.eager_model, world))
    # the model's shapes, for the reports to draw its arithmetic at every world size
    found.metrics["model"] = {
        "storages": [
            {"shape": list(p.shape), "element_size": p.element_size()}
            for p in distinct_storages(run.eager_model).values()
        ],
        "buffer bytes": sum(b.nbytes for b in run.eager_model.buffers()),
    }
    return found


def check_tensor_parallel(run: TensorParallelRecord) -> Findings:
    found = Findings()
    world, rank = run.world_size, run.rank
    wanted = megatron.placements(run.layers, list(run.shapes))
    for name, shape in run.shapes.items():
        placed, want = run.placements.get(name), wanted[name]
        with found.expect("sharding.placement", f"placement [{name}]", name=name):
            assert placed is not None, "the model under test has no such parameter"
            what = "a plain tensor" if want is None else f"a DTensor {', '.join(want)} over {world} ranks"
            got = "a plain tensor" if placed.placements is None else f"a DTensor {', '.join(placed.placements)}"
            if placed.mesh_size is not None:
                got += f" over {placed.mesh_size} ranks"
            assert (placed.placements, placed.mesh_size) == (want, None if want is None else world), (
                f"{got}, expected {what}"
            )
            local = megatron.local_shape(shape, want, rank, world)
            assert placed.local_shape == local, (
                f"rank {rank} holds shape {placed.local_shape}, expected {local} (of {shape}, {what})"
            )
    held = sum(math.prod(p.local_shape) for p in run.placements.values())
    want_held = sum(math.prod(megatron.local_shape(s, wanted[n], rank, world)) for n, s in run.shapes.items())
    found.equal("sharding.elements", "elements held", held, want_held)
    return found


AREA = Area("sharding", check=None, simulated=check, tensor_parallel=check_tensor_parallel)

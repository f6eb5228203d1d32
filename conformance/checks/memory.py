"""Memory: what a rank holds and allocates, per phase, against bounds derived from the model.

Measured on every rank by the rank side (``conformance/rank/measure.py``): the peak of
bytes allocated during each phase of the second step (``forward``, ``backward``, ``step``:
compiled by then) and during ``setup`` (construction, jit, sharding, materialization); and
the bytes that stay alive after setup, by a census of every live tensor storage.

Estimated for setup from the model (``setup_estimate``), and from the traces for forward
and backward: the peak of live bytes in Thunder's final forward and backward execution
traces, from their data flow (``dataflow.py``).

Eager PyTorch's peaks for the same model, this rank's input and the same phase are recorded
beside them as a second, independent reference (reported, not bounded: eager is unsharded).

Bounds:
- after setup a rank holds its shards and buffers, nothing more (unsharded originals freed),
  plus SLACK_BYTES for 0-d scalars (4 bytes seen on litgpt);
- under meta init, the setup peak stays within the shards and buffers plus three copies of
  the largest module's own tensors (materialization goes module by module; sharding one holds
  the unsharded tensor, its padded copy and the shard cut from it), plus SLACK_BYTES: the
  whole model is never allocated on one rank;
- under real init, the setup peak stays within ESTIMATE_FACTOR of the model's arithmetic
  (``setup_estimate``: eager PyTorch's construction peak, then every shard cut from a padded
  copy and cloned while the originals live) plus SLACK_BYTES;
- the measured forward and backward peaks stay within ESTIMATE_FACTOR of the estimate plus
  SLACK_BYTES; on gloo the backward may also hold the full gradient of every reduce-scatter
  in flight (gloo reduce-scatters by all-reducing a full-size clone).
"""

from __future__ import annotations

from torch import nn

from conformance.checks.area import Area
from conformance.checks.dataflow import estimated_peak
from conformance.checks.findings import Findings
from conformance.checks.margins import ESTIMATE_FACTOR, SLACK_BYTES
from conformance.checks.record import CellRecord
from conformance.checks.storages import distinct_storages, padded_bytes
from conformance.checks.traces import collective_symbols, final_traces
from conformance.matrix.plan import plan

MATERIALIZATION_COPIES = 3


def shard_bytes(module: nn.Module, world_size: int) -> int:
    return sum(padded_bytes(p, world_size) for p in distinct_storages(module).values()) // world_size


def largest_module_bytes(module: nn.Module, world_size: int) -> int:
    """The most bytes of parameters and buffers that any one module owns directly (dim 0
    padded to the world size, as sharding pads it)."""
    return max(
        (
            sum(padded_bytes(t, world_size) for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)))
            for m in module.modules()
        ),
        default=0,
    )


def setup_estimate(run: CellRecord, resident: int) -> int:
    """The peak of setup by the model's arithmetic, for the cell's init mode.

    Real init builds the whole model as eager PyTorch does (its peak measured when the kit
    built the reference: construction is the user's code, not Thunder's), then shards one
    parameter at a time: cut from a padded copy and cloned, the originals released at the
    end. Meta init materializes one module's tensors at a time, pads a copy of each to cut
    its shard from, and keeps only the shards (``resident`` in the end: shards and buffers);
    from a transformed (already sharded) state dict only shards are made.
    """
    world = run.cell.world_size
    reference = run.reference
    if run.init.on_meta:
        if plan(run.cell).materialize == "transformed":
            return resident
        return resident + 2 * largest_module_bytes(reference, world)
    # then parameter by parameter: a padded copy (where dim 0 needs padding) to cut the shard
    # from, the shard cloned into the new parameter; the originals are released once all
    # shards are cut (FSDP walks a list that holds them)
    params = distinct_storages(reference).values()
    live = sharding = sum(p.nbytes for p in params) + sum(b.nbytes for b in reference.buffers())
    for p in params:
        whole, padded = p.nbytes, padded_bytes(p, world)
        piece = padded // world
        sharding = max(sharding, live + (padded if padded != whole else 0) + piece, live + 2 * piece)
        live += piece
    return max(run.memory.eager_peaks["setup"], sharding)


def check(run: CellRecord) -> Findings:
    found = Findings()
    cell, reference, measured = run.cell, run.reference, run.memory.peaks
    world = cell.world_size
    buffers = sum(b.nbytes for b in run.setup.reference_buffers.values())
    resident = shard_bytes(reference, world) + buffers  # all a rank should hold between steps
    alive = run.memory.alive_after_setup
    found.metrics["measured"] = dict(measured)
    found.metrics["eager"] = dict(run.memory.eager_peaks)  # unsharded eager model, same input: for comparison

    found.metrics["retained after setup"] = {"measured": alive, "bound": resident + SLACK_BYTES}
    with found.expect("memory held after setup"):
        assert alive <= resident + SLACK_BYTES, (
            f"{alive} bytes alive after setup, but a rank should hold only its shards and buffers "
            f"({resident} bytes): unsharded originals or copies were kept"
        )
    estimate = setup_estimate(run, resident)
    if run.init.on_meta:
        bound = resident + MATERIALIZATION_COPIES * largest_module_bytes(reference, world) + SLACK_BYTES
    else:
        bound = int(ESTIMATE_FACTOR * estimate) + SLACK_BYTES
    found.metrics["setup peak"] = {
        "measured": measured["setup"],
        "estimate": estimate,
        "bound": bound,
        "ratio": measured["setup"] / estimate if estimate else None,
    }
    with found.expect(f"setup peak under {'meta' if run.init.on_meta else 'real'} init"):
        assert measured["setup"] <= bound, (
            f"setup allocated {measured['setup']} bytes at its peak; the model's arithmetic for "
            f"{run.cell.init} init needs {estimate} (bound {bound})"
        )

    for phase, trace in final_traces(run.thunder_module).by_phase().items():
        estimate = estimated_peak(trace, run.device)
        bound = int(ESTIMATE_FACTOR * estimate) + SLACK_BYTES
        if phase == "backward" and run.backend == "gloo":
            reduce_scatters = len(collective_symbols(trace)["reduce_scatter"])
            trainable = distinct_storages(reference, trainable_only=True).values()
            bound += reduce_scatters and sum(p.nbytes for p in trainable)
        found.metrics[f"{phase} peak"] = {
            "measured": measured[phase],
            "estimate": estimate,
            "bound": bound,
            "ratio": measured[phase] / estimate if estimate else None,
            "eager": run.memory.eager_peaks.get(phase),
        }
        with found.expect(f"{phase} peak"):
            assert measured[phase] <= bound, (
                f"{phase} allocated {measured[phase]} bytes at its peak; the trace's data flow needs "
                f"{estimate} (bound {bound}): something is kept alive past its last use"
            )
    return found


AREA = Area("memory", check)

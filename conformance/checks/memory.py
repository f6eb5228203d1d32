"""Memory: what a rank holds and allocates, per phase, against bounds built from the model's
arithmetic and from eager PyTorch, never from the traces of the Thunder under test.

Measured on every rank by the rank side (``conformance/rank/measure.py``): setup's peak; a
census of every live storage after setup; and, by a ledger of what the Thunder module's
work allocates from the end of setup on (the eager reference's work in between is not
counted), the peak of the measured step's forward and backward, every optimizer step's
peak, and what is held after every backward and every step.

Terms, per rank, from the eager model and the world size (dim 0 padded to a multiple of it):
``shards`` (every distinct parameter storage / world size), ``buffers``, ``unsharded`` (what
the forward's all-gathers produce), ``gradient shards`` (trainable shards), ``optimizer
state`` (AdamW: exp_avg and exp_avg_sq, one of each per trainable
shard; its step counters are 0-d: counted, not summed; SGD without momentum: none).

On CUDA every term, exact or bounding, counts each tensor allocated apart as the caching
allocator does: its bytes rounded up to a 512-byte block (``storages.allocated_bytes``).
A shard, a gradient shard, an exp_avg, each is one allocation; AdamW's step counters live on
the CPU (capturable and fused off) and add nothing there; a bound that adds up several
tensors rounds each (an upper bound where Thunder packs several in one bucket).

Exact (on CPU the tracker counts bytes exactly; on CUDA up to the allocator's blocks):
- after setup a rank holds its shards and buffers, nothing more (0-d storages aside);
- after each backward, the gradient shards and the optimizer state; after each step (its
  gradients zeroed), the optimizer state: a tensor kept per step, an unsharded gradient or
  parameter, an activation kept past its backward, all fail here, whatever their size;
- each optimizer step allocates at most what the same optimizer allocates stepping eager
  tensors of the shard shapes beside it.

Bounded:
- setup: under meta init the shards and buffers plus three copies of the largest module's
  own tensors (materialization goes module by module; sharding one holds the unsharded
  tensor, its padded copy and the shard cut from it); under real init ESTIMATE_FACTOR x the
  model's arithmetic (``setup_estimate``);
- forward (the measured step: SGD, no optimizer state): the unsharded parameters (gathered
  and, under ZERO2, saved for the backward) plus ACTIVATION_FACTOR x eager's forward peak on
  the same input (the float32 twin's below float32: Thunder computes low-precision chains in
  float32) plus what the offloading transform copied on the same device, plus on gloo the
  largest gathered bucket (its worker thread releases a finished all-gather's buffers late);
- backward: the forward's bound plus eager's backward peak (its full gradients included).
  Nothing for gloo: it reduce-scatters by all-reducing a full-size clone of its input (torch
  PR #118911), but makes the clone on its own thread, where the tracker (a thread-local
  dispatch mode) does not see it; NCCL reduce-scatters without a clone.

Thunder's final traces give a diagnostic only: the peak of their data flow over what the
phase allocates (``dataflow.py``), reported beside the measurement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from conformance.checks.area import Area
from conformance.checks.collectives import buckets, ddp_bucket_mb, ddp_buckets
from conformance.checks.dataflow import estimated_peak
from conformance.checks.findings import Findings
from conformance.checks.margins import ESTIMATE_FACTOR
from conformance.checks.record import MEASURED_STEP, CellRecord, SimulatedRecord
from conformance.checks.storages import (
    allocated_bytes,
    allocations,
    distinct_storages,
    padded_bytes,
    piece_bytes,
    shard_bytes,
    tied_duplicates,
)
from conformance.checks.traces import collective_symbols
from conformance.matrix.plan import plan
from fixtures.compositions import COMPOSITIONS

MATERIALIZATION_COPIES = 3
# Thunder's forward on the torch executor runs decomposed, unfused: beside each intermediate
# eager keeps, at most one more of the same size alive (measured on the ci profile: the
# forward's peak over the unsharded parameters is 0.4 to 2.05 x eager's float32 peak)
ACTIVATION_FACTOR = 2


def replicated(run: CellRecord | SimulatedRecord) -> bool:
    """Whether every rank holds whole parameters (DDP) rather than shards."""
    return COMPOSITIONS[run.cell.composition].replicated


def held_world(run: CellRecord | SimulatedRecord) -> int:
    """The number of pieces each parameter is cut in on a rank: the world size under FSDP, 1
    (whole tensors, no padding) under DDP, where every term below holds with it."""
    return 1 if replicated(run) else run.cell.world_size


def largest_module_bytes(module: nn.Module, world_size: int, device: torch.device | str = "cpu") -> int:
    """The most bytes of parameters and buffers that any one module owns directly (dim 0
    padded to the world size, as sharding pads it; on CUDA each tensor rounded)."""
    return max(
        (
            allocations(
                (padded_bytes(t, world_size) for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))),
                device,
            )
            for m in module.modules()
        ),
        default=0,
    )


def setup_estimate(run: CellRecord | SimulatedRecord, resident: int) -> int:
    """The peak of setup by the model's arithmetic, for the cell's init mode.

    Real init builds the whole model as eager PyTorch does (its peak measured when the kit
    built the reference: construction is the user's code, not Thunder's), then shards one
    parameter at a time: cut from a padded copy and cloned, the originals released at the
    end. Meta init materializes one module's tensors at a time, pads a copy of each to cut
    its shard from, and keeps only the shards (``resident`` in the end: shards and buffers);
    from a transformed (already sharded) state dict only shards are made.
    """
    world, device = held_world(run), run.device
    reference = run.reference
    if run.init.on_meta:
        if plan(run.cell).materialize == "transformed":
            return resident
        return resident + 2 * largest_module_bytes(reference, world, device)
    # then parameter by parameter: a padded copy (where dim 0 needs padding) to cut the shard
    # from, the shard cloned into the new parameter; the originals are released once all
    # shards are cut (FSDP walks a list that holds them). Each one allocation (rounded on CUDA).
    params = distinct_storages(reference).values()
    live = sharding = allocations((p.nbytes for p in params), device) + allocations(
        (b.nbytes for b in reference.buffers()), device
    )
    for p in params:
        whole, padded = p.nbytes, padded_bytes(p, world)
        piece = piece_bytes(padded, world, device)
        copy = allocated_bytes(padded, device) if padded != whole else 0
        sharding = max(sharding, live + copy + piece, live + 2 * piece)
        live += piece
    return max(run.memory.eager_peaks["setup"], sharding)


@dataclasses.dataclass(frozen=True)
class Terms:
    """The model's arithmetic for one rank, in bytes as the rank's device reads them (on CUDA
    each tensor its allocator block; see the module's docstring)."""

    shards: int
    buffers: int
    unsharded: int
    gradient_shards: int
    adamw_state: int
    handed_over: int  # the state dict the kit handed Thunder (0: none)
    # DDP with buckets: one flat buffer per bucket, which packing keeps from the first
    # backward on (0 without buckets, and under FSDP)
    gradient_buckets: int = 0

    @property
    def resident(self) -> int:
        return self.shards + self.buffers

    def optimizer_state(self, optimizer: str) -> int:
        return self.adamw_state if optimizer == "AdamW" else 0


def terms(run: CellRecord | SimulatedRecord) -> Terms:
    reference, world, device = run.reference, held_world(run), run.device
    # one gradient shard per trainable storage (on CUDA a block each; views of one reduce-
    # scattered bucket round up less, so this stays an upper bound)
    gradient_shards = shard_bytes(reference, world, device, trainable_only=True)
    return Terms(
        shards=shard_bytes(reference, world, device),
        buffers=allocations(_counted(reference.buffers()), device),
        # what the forward's all-gathers produce: nothing where every rank holds whole parameters
        unsharded=0
        if replicated(run)
        else allocations((padded_bytes(p, world) for p in distinct_storages(reference).values()), device),
        gradient_shards=gradient_shards,
        # exp_avg and exp_avg_sq: one allocation each per trainable shard. The 0-d step
        # counters: torch.optim.AdamW keeps them on the CPU unless capturable or fused
        # (_init_group in torch/optim/adam.py), which the kit's AdamW is not, so nothing on
        # CUDA; on CPU they are 0-d, counted apart rather than summed
        adamw_state=2 * gradient_shards,
        handed_over=_handed_over_bytes(run),
        gradient_buckets=_gradient_bucket_bytes(run),
    )


def _gradient_bucket_bytes(run: CellRecord | SimulatedRecord) -> int:
    """DDP's gradient buckets: each one flat buffer of its gradients' bytes, where the
    backward packs them. A backward that all-reduces every gradient alone where the model has
    fewer buckets than gradients packs nothing (the pin: bucket_size_in_mb is not applied, a
    finding of the collectives area that its xfails entry names) and so holds no buffer:
    counting the buffers there would give the held bounds their bytes of slack, in which a
    copy of the largest parameter or a leak per step hides."""
    reference, bucketing = run.reference, run.cell.bucketing
    if not replicated(run) or ddp_bucket_mb(reference, bucketing) <= 0:
        return 0
    packed = ddp_buckets(reference, bucketing)
    gradients = len(distinct_storages(reference, trainable_only=True))
    traces = getattr(run, "traces", None)
    backward = traces.backward if traces is not None else None
    packable = len(packed) != gradients
    if backward is not None and packable and len(collective_symbols(backward)["all_reduce"]) == gradients:
        return 0
    sizes = {n: p.numel() * p.element_size() for n, p in reference.named_parameters()}
    return allocations((sum(sizes[n] for n in bucket) for bucket in packed), run.device)


def _handed_over_bytes(run: CellRecord | SimulatedRecord) -> int:
    """Bytes of the state dict the kit handed over: the reference's own (each entry a copy),
    or this rank's shards of it (tied duplicates left out) with the persistent buffers."""
    kind, device = plan(run.cell).handed_over, run.device
    state = run.reference.state_dict()
    if kind == "original":
        return allocations(_counted(state.values()), device)
    if kind == "transformed":
        duplicates = tied_duplicates(run.reference)
        params = {n for n, _ in run.reference.named_parameters()}
        world = run.cell.world_size
        return sum(
            piece_bytes(padded_bytes(t, world), world, device) if n in params else allocated_bytes(t.nbytes, device)
            for n, t in state.items()
            if n not in duplicates and t.dim()  # a 0-d entry is counted apart, as the census does
        )
    return 0


def _counted(tensors: Iterable[torch.Tensor]) -> Iterator[int]:
    """Bytes of each tensor the census sums: 0-d ones (a BatchNorm's batch count) are counted
    apart, never summed (``rank/measure.census``)."""
    return (t.nbytes for t in tensors if t.dim())


def check(run: CellRecord) -> Findings:
    found = Findings()
    memory = run.memory
    model = terms(run)
    found.metrics["terms"] = dataclasses.asdict(model)
    found.metrics["measured"] = dict(memory.peaks)
    found.metrics["eager"] = dict(memory.eager_peaks)  # unsharded eager model, same input: for comparison

    _held_after_setup(run, model, found)

    estimate = setup_estimate(run, model.resident)
    _bounded(found, "setup", memory.peaks["setup"], _setup_bound(run, model, estimate), estimate=estimate)

    held = _held_after_steps(run, model, found)
    eager = memory.eager_peaks
    activations = eager.get("float32 forward", eager["forward"])
    copies = allocations(
        (s.nbytes for s in memory.saved or [] if s is not None and s.offloaded and s.device == str(run.device)),
        run.device,
    )
    forward = model.unsharded + ACTIVATION_FACTOR * activations + copies + _late_release(run)
    backward = forward + eager.get("float32 backward", eager["backward"])
    traces = run.traces.by_phase()
    for phase, bound in (("forward", forward), ("backward", backward)):
        trace = traces.get(phase)
        diagnostic = estimated_peak(trace, run.device) if trace is not None else None
        _bounded(found, phase, memory.peaks[phase], held + bound, estimate=diagnostic)
    return found


def check_simulated(run: SimulatedRecord) -> Findings:
    """A sampled rank of a simulated world: what it holds after setup, exactly, and setup's
    peak under the same bound as a real world's (meta init: materialization goes module by
    module). Its steps move no data, so nothing after setup is measured."""
    found = Findings()
    model = terms(run)
    found.metrics["terms"] = dataclasses.asdict(model)
    found.metrics["measured"] = {"setup": run.memory.setup_peak, "alive after setup": run.memory.alive_after_setup}
    _held_after_setup(run, model, found)
    estimate = setup_estimate(run, model.resident)
    _bounded(found, "setup", run.memory.setup_peak, _setup_bound(run, model, estimate), estimate=estimate)
    return found


def _setup_bound(run: CellRecord | SimulatedRecord, model: Terms, estimate: int) -> int:
    """Setup's bound: under meta init the shards and buffers plus the copies materialization
    makes of the largest module; under real init the estimate with its factor."""
    if run.init.on_meta:
        world = run.cell.world_size
        return model.resident + MATERIALIZATION_COPIES * largest_module_bytes(run.reference, world, run.device)
    return int(ESTIMATE_FACTOR * estimate)


def _late_release(run: CellRecord) -> int:
    """What gloo may still hold when a phase is read: its worker thread lets go of a finished
    all-gather's buffers a moment after ``wait()`` returns, so the forward's peak can include
    one gathered bucket more than the trace keeps (measured: an mlp cell's forward peak 2272 or
    3232 B run to run, +960 B, the gathered fc1.weight). The largest bucket, on gloo only."""
    if run.backend != "gloo" or replicated(run):  # DDP gathers nothing
        return 0
    storages = distinct_storages(run.reference)
    world = run.cell.world_size
    return max(
        (
            allocations((padded_bytes(storages[n], world) for n in names), run.device)
            for names in buckets(run.reference, run.cell.bucketing).values()
        ),
        default=0,
    )


def _bounded(found: Findings, phase: str, measured: int, bound: int, estimate: int | None) -> None:
    found.metrics[f"{phase} peak"] = {
        "measured": measured,
        "bound": bound,
        "bound / measured": bound / measured if measured else None,
        "estimate": estimate,  # a diagnostic: setup's from the model, the others from Thunder's traces
        "ratio": measured / estimate if estimate else None,
    }
    with found.expect(f"{phase} peak"):
        assert measured <= bound, f"{measured} bytes at the peak of {phase}, over the bound of {bound}"


def _held_after_setup(run: CellRecord | SimulatedRecord, model: Terms, found: Findings) -> None:
    alive = run.memory.alive_after_setup
    found.metrics["retained after setup"] = {
        "measured": alive,
        "bound": model.resident,
        "0-d storages": run.memory.scalars_after_setup,
    }
    with found.expect("memory held after setup"):
        excess = alive - model.resident
        why = (
            "exactly the bytes of the state dict handed over"
            if model.handed_over and excess == model.handed_over
            else "unsharded originals or copies were kept"
        )
        assert excess <= 0, f"{alive} bytes alive, {excess} more than the shards and buffers ({model.resident}): {why}"


def _held_after_steps(run: CellRecord, model: Terms, found: Findings) -> int:
    """Exact: what each backward and each step leaves held. Returns what the measured step
    started from: the optimizer state before it, and DDP's bucket buffers where a backward
    before it packed them (they stay from the first backward on)."""
    memory = run.memory
    steps = [s.optimizer for s in run.steps]

    def state_before(k: int) -> int:
        """The optimizer state that exists when step ``k`` starts: none on its optimizer's first."""
        return model.optimizer_state(steps[k]) if k and steps[k - 1] == steps[k] else 0

    for k, optimizer in enumerate(steps):
        state, before = model.optimizer_state(optimizer), state_before(k)
        kept = model.gradient_buckets  # held from the first backward on
        checks = (
            (
                "after backward",
                memory.held_after_backward,
                before + model.gradient_shards + kept,
                "the gradient shards" + (" and DDP's gradient buckets" if kept else ""),
            ),
            (
                "after the step",
                memory.held_after_step,
                state + kept,
                "the optimizer state" + (" and DDP's gradient buckets" if kept else ""),
            ),
        )
        for when, series, expected, what in checks:
            got = series[k] if k < len(series) else None
            found.metrics.setdefault(f"held {when}", []).append({"measured": got, "expected": expected})
            with found.expect(f"memory held {when} at step {k} ({optimizer})"):
                assert got is not None, "not measured"
                assert got <= expected, (
                    f"{got} bytes held, {got - expected} more than {what}"
                    + (" and the optimizer state" if when == "after backward" and before else "")
                    + f" ({expected})"
                )
        peaks = memory.step_peaks, memory.eager_step_peaks
        if k < min(map(len, peaks)):
            got, eager = peaks[0][k], peaks[1][k]
            found.metrics.setdefault("optimizer step peaks", []).append({"measured": got, "eager": eager})
            with found.expect(f"optimizer step {k} ({optimizer}) peak"):
                assert got <= eager, (
                    f"the step allocated {got} bytes at its peak; {optimizer} stepping eager tensors of "
                    f"the shard shapes allocates {eager}"
                )
    return state_before(MEASURED_STEP) + (model.gradient_buckets if MEASURED_STEP > 0 else 0)


AREA = Area("memory", check, simulated=check_simulated)

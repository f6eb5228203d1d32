"""The model's arithmetic the memory area's bounds are built from, per rank, from the eager
model and the world size (dim 0 padded to a multiple of it): ``shards`` (every distinct
parameter storage / world size), ``buffers``, ``unsharded`` (what the forward's all-gathers
produce), ``gradient shards`` (trainable shards), ``optimizer state`` (AdamW: exp_avg and
exp_avg_sq, one of each per trainable shard; its step counters are 0-d: counted, not summed;
SGD without momentum: none); DDP's gradient buckets, the state dict handed over, and setup's
estimated peak.

On CUDA every term, exact or bounding, counts each tensor allocated apart as the caching
allocator does: its bytes rounded up to a 512-byte block (``storages.allocated_bytes``).
A shard, a gradient shard, an exp_avg, each is one allocation; AdamW's step counters live on
the CPU (capturable and fused off) and add nothing there; a bound that adds up several
tensors rounds each (an upper bound where Thunder packs several in one bucket).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch

from conformance.checks.buckets import buckets, ddp_bucket_mb, ddp_buckets
from conformance.checks.declared import UNBUCKETED
from conformance.checks.memory.setup_path import SetupPath, setup_path
from conformance.checks.record import CellRecord, SimulatedRecord
from conformance.checks.storages import (
    allocated_bytes,
    allocations,
    distinct_storages,
    padded_bytes,
    piece_bytes,
    shard_bytes,
    tied_duplicates,
)
from conformance.matrix.initialization import plan
from fixtures.compositions import COMPOSITIONS


def replicated(run: CellRecord | SimulatedRecord) -> bool:
    """Whether every rank holds whole parameters (DDP) rather than shards."""
    return COMPOSITIONS[run.cell.composition].replicated


def pytorch_parallelism(run: CellRecord | SimulatedRecord) -> bool:
    """Whether PyTorch's FSDP2 or DDP own the cell's collectives (``fixtures/torch_parallel.py``)."""
    return COMPOSITIONS[run.cell.composition].parallelism == "torch"


def eager_peak(run: CellRecord, phase: str) -> int:
    """Eager's peak of ``phase`` ("forward", "backward") on the rank's input, the float32
    twin's below float32 (Thunder computes low-precision chains in float32)."""
    eager = run.memory.eager_peaks
    return eager.get(f"float32 {phase}", eager[phase])


def held_world(run: CellRecord | SimulatedRecord) -> int:
    """The number of pieces each parameter is cut in on a rank: the world size under FSDP, 1
    (whole tensors, no padding) under DDP, where every term below holds with it."""
    return 1 if replicated(run) else run.cell.world_size


def meta_setup(run: CellRecord | SimulatedRecord, resident: int) -> SetupPath:
    """Setup's peak under meta init, part by part (``setup_path.py``)."""
    setup = plan(run.cell)
    return setup_path(
        run.eager_model,
        run.memory.module_inits,
        materialize=setup.materialize,
        handed_over=setup.handed_over,
        resident=resident,
        world=None if replicated(run) else run.cell.world_size,
        device=run.device,
    )


def setup_estimate(run: CellRecord | SimulatedRecord, resident: int) -> int:
    """The peak of setup by the model's arithmetic, for the cell's init mode.

    Real init builds the whole model as eager PyTorch does (its peak measured when the kit
    built the eager model: construction is the user's code, not Thunder's), then shards one
    parameter at a time: cut from a padded copy and cloned, the originals released at the
    end; DDP shards nothing (its broadcast writes each tensor in place), so its setup is the
    construction alone. Meta init follows Thunder's materialization module by module
    (``setup_path.py``).
    """
    world, device = held_world(run), run.device
    eager_model = run.eager_model
    if replicated(run) and not run.init.on_meta:
        # DDP cuts nothing: setup is the user's construction, then a broadcast in place;
        # PyTorch's DDP broadcasts rank 0's parameters and buffers flattened into one buffer
        # (``_sync_module_states``), its buckets already built (in ``resident``)
        construction = max(run.memory.eager_peaks["setup"], resident)
        if pytorch_parallelism(run):
            model = eager_model_bytes(run)
            return construction + model
        return construction
    if run.init.on_meta:
        return meta_setup(run, resident).peak
    # then parameter by parameter: a padded copy (where dim 0 needs padding) to cut the shard
    # from, the shard cloned into the new parameter; the originals are released once all
    # shards are cut (FSDP walks a list that holds them). Each one allocation (rounded on CUDA).
    # A partly-meta model's fresh part is on meta there: cut as meta, nothing allocated, then
    # materialized module by module over the shards, as under meta init.
    fresh = run.drawn_by_thunder() if isinstance(run, CellRecord) and run.init.partly_meta else set()
    on_meta = {id(t) for n, t in (*eager_model.named_parameters(), *eager_model.named_buffers()) if n in fresh}
    params = [p for p in distinct_storages(eager_model).values() if id(p) not in on_meta]
    live = sharding = allocations((p.nbytes for p in params), device) + allocations(
        (b.nbytes for b in eager_model.buffers() if id(b) not in on_meta), device
    )
    for p in params:
        whole, padded = p.nbytes, padded_bytes(p, world)
        piece = piece_bytes(padded, world, device)
        copy = allocated_bytes(padded, device) if padded != whole else 0
        sharding = max(sharding, live + copy + piece, live + 2 * piece)
        live += piece
    peak = max(run.memory.eager_peaks["setup"], sharding)
    if fresh:
        originals = allocations((p.nbytes for p in params), device)
        peak = max(peak, partly_meta_setup(run, resident, originals).peak)
    return peak


def partly_meta_setup(run: CellRecord, resident: int, originals: int) -> SetupPath:
    """The materialization of a partly-meta model's fresh part, after sharding: its modules
    alone, along the path of ``setup_path.py``, over every shard, and over the loaded part's
    original parameters (``originals``: their bytes) where the caller still holds them."""
    from fixtures.models import fixture_for

    held = originals if COMPOSITIONS[run.cell.composition].caller_holds_originals else 0
    return setup_path(
        run.eager_model,
        run.memory.module_inits,
        materialize="module",
        handed_over=None,
        resident=resident + held,
        world=None if replicated(run) else run.cell.world_size,
        device=run.device,
        only=set(fixture_for(run.cell.model, run.cell.spec).fresh),
    )


@dataclasses.dataclass(frozen=True)
class Terms:
    """The model's arithmetic for one rank, in bytes as the rank's device reads them (on CUDA
    each tensor its allocator block; see this module's docstring)."""

    shards: int
    buffers: int
    unsharded: int
    gradient_shards: int
    adamw_state: int
    handed_over: int  # the state dict the kit handed Thunder (0: none)
    # DDP with buckets: one flat buffer per bucket, held from step ``buckets_from_step`` on (0
    # without buckets, and under FSDP): Thunder's DDP packs them in the first backward;
    # PyTorch's builds them at construction (``setup_buckets``) and rebuilds them once, in the
    # order the gradients arrived, in the second forward (the first freed: before the ledger's
    # zero, so it never sees them go)
    gradient_buckets: int = 0
    buckets_from_step: int = 0
    setup_buckets: int = 0

    @property
    def resident(self) -> int:
        return self.shards + self.buffers + self.setup_buckets

    def buckets_at(self, step: int) -> int:
        """DDP's buckets the ledger counts during step ``step``'s backward and after it."""
        return self.gradient_buckets if step >= self.buckets_from_step else 0

    def optimizer_state(self, optimizer: str) -> int:
        return self.adamw_state if optimizer == "AdamW" else 0


def terms(run: CellRecord | SimulatedRecord) -> Terms:
    eager_model, world, device = run.eager_model, held_world(run), run.device
    # one gradient shard per trainable storage (on CUDA a block each; views of one reduce-
    # scattered bucket round up less, so this stays an upper bound)
    gradient_shards = shard_bytes(eager_model, world, device, trainable_only=True)
    buckets, torch_ddp = _gradient_bucket_bytes(run), pytorch_parallelism(run)
    return Terms(
        shards=shard_bytes(eager_model, world, device),
        buffers=allocations(_counted(eager_model.buffers()), device),
        # what the forward's all-gathers produce: nothing where every rank holds whole parameters
        unsharded=0
        if replicated(run)
        else allocations((padded_bytes(p, world) for p in distinct_storages(eager_model).values()), device),
        gradient_shards=gradient_shards,
        # exp_avg and exp_avg_sq: one allocation each per trainable shard. The 0-d step
        # counters: torch.optim.AdamW keeps them on the CPU unless capturable or fused
        # (_init_group in torch/optim/adam.py), which the kit's AdamW is not, so nothing on
        # CUDA; on CPU they are 0-d, counted apart rather than summed
        adamw_state=2 * gradient_shards,
        handed_over=_handed_over_bytes(run),
        gradient_buckets=buckets,
        buckets_from_step=1 if torch_ddp else 0,
        setup_buckets=buckets if torch_ddp else 0,
    )


def _gradient_bucket_bytes(run: CellRecord | SimulatedRecord) -> int:
    """DDP's gradient buckets as its documented rule packs the model's gradients: each one
    flat buffer of its gradients' bytes, kept from the first backward on. None where the
    xfails file declares that this Thunder packs nothing (``declared.UNBUCKETED``; the pin:
    bucket_size_in_mb is not applied): counting buffers that do not exist would give the held
    bounds their bytes of slack, in which a copy of the largest parameter or a leak per step
    hides. Whether a Thunder packs is the collectives area's finding, never read here."""
    eager_model, bucketing = run.eager_model, run.cell.bucketing
    if pytorch_parallelism(run):
        # PyTorch's DDP: every trainable gradient in a flat bucket, whatever the cell's bucketing
        # (an axis of Thunder's transforms); on CUDA each parameter rounded apart, an upper bound
        # of the buckets' own blocks
        if not replicated(run):
            return 0
        trainable = distinct_storages(eager_model, trainable_only=True).values()
        return allocations((p.nbytes for p in trainable), run.device)
    if not replicated(run) or ddp_bucket_mb(eager_model, bucketing) <= 0 or UNBUCKETED in run.declared:
        return 0
    packed = ddp_buckets(eager_model, bucketing)
    sizes = {n: p.numel() * p.element_size() for n, p in eager_model.named_parameters()}
    return allocations((sum(sizes[n] for n in bucket) for bucket in packed), run.device)


def eager_model_bytes(run: CellRecord | SimulatedRecord) -> int:
    """Every parameter storage and buffer of the model, whole (0-d buffers counted apart)."""
    params = distinct_storages(run.eager_model).values()
    return sum(p.nbytes for p in params) + sum(_counted(run.eager_model.buffers()))


def _handed_over_bytes(run: CellRecord | SimulatedRecord) -> int:
    """Bytes of the state dict the kit handed over: the eager model's own (each entry a copy),
    or this rank's shards of it (tied duplicates left out) with the persistent buffers."""
    kind, device = plan(run.cell).handed_over, run.device
    state = run.eager_model.state_dict()
    if kind == "original":
        return allocations(_counted(state.values()), device)
    if kind == "transformed":
        duplicates = tied_duplicates(run.eager_model)
        params = {n for n, _ in run.eager_model.named_parameters()}
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


# gloo runs a process group's collectives on a pool of worker threads, two per device (torch's
# ProcessGroupGloo constructor; tests/unit/test_cuda_memory.py reads it off a real one)
# calibrated on a measurement: with one unit in all, ci under --thunder-coverage read a forward peak 84 B over
# (no_reset bfloat16: two parameters held, 2026-11-28):
# docs/measurements.md#a-worlds-start-the-agent-at-report-time-gloos-two-threads-2026-11-28-session-30
GLOO_THREADS = 2


def late_release(run: CellRecord) -> int:
    """What gloo may still hold when a phase is read: each of its worker threads lets go of a
    finished all-gather's buffers a moment after ``wait()`` returns, so the forward's peak
    can include one gathered unit more than the trace keeps per thread, varying run to run.
    On gloo only, the ``GLOO_THREADS`` largest units: buckets as the cell's bucketing packs
    them, or parameters where the xfails file declares that this Thunder gathers per parameter
    (``declared.UNBUCKETED``): a bucket's bytes there would hide a gathered parameter kept
    to the forward's end."""
    if run.backend != "gloo" or replicated(run):  # DDP gathers nothing
        return 0
    storages = distinct_storages(run.eager_model)
    world = run.cell.world_size
    bucketing = "none" if UNBUCKETED in run.declared else run.cell.bucketing
    units = sorted(
        (
            allocations((padded_bytes(storages[n], world) for n in names), run.device)
            for names in buckets(run.eager_model, bucketing).values()
        ),
        reverse=True,
    )
    return sum(units[:GLOO_THREADS])

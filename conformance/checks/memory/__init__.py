"""Memory: what a rank holds and allocates, per phase, against bounds built from the model's
arithmetic and from eager PyTorch, never from the traces of the Thunder under test but for
what the forward leaves alive and the peaks along the plan, where the runtime is judged
against its traces' own plan.

Measured on every rank by the rank side (``conformance/rank/measure.py``): setup's peak; a
census of every live storage after setup; and, by a ledger of what the Thunder module's
work allocates from the end of setup on (the eager model's work in between is not
counted), the peak of the measured step's forward and backward, every optimizer step's
peak, and what is held after every backward and every step.

The terms of the bounds are the model's arithmetic per rank (``arithmetic.py``): the
shards, buffers, unsharded parameters, gradient shards and optimizer state, on CUDA each
tensor rounded up to the caching allocator's block.

Exact (on CPU the tracker counts bytes exactly; on CUDA up to the allocator's blocks):
- after setup a rank holds its shards and buffers, nothing more (0-d storages aside);
- after each backward, the gradient shards and the optimizer state; after each step (its
  gradients zeroed), the optimizer state: a tensor kept per step, an unsharded gradient or
  parameter, an activation kept past its backward, all fail here, whatever their size;
- each optimizer step allocates at most what the same optimizer allocates stepping eager
  tensors of the shard shapes beside it;
- after the forward a rank holds what its trace returns (outputs and saved tensors, by the
  data flow), and under ZERO3 that includes no all-gather's output.

A cell whose executor runs code Inductor generated (torchcompile) is measured on the CPU through
setup only (``rank/measure.unmeasurable``): its rows after setup are not judged, and its metrics
say so. Under PyTorch's parallelism (FSDP2, DDP) the forward's rows and the peaks are
``torch_parallel.py``'s: no single trace states what such a forward keeps.

Bounded:
- setup, exactly on the CPU (on CUDA with ESTIMATE_FACTOR: the allocator's blocks): under
  meta init the path Thunder's materialization takes, module by module, from eager's
  initialization of each module on its own and the model's arithmetic (``setup_path.py``);
  under real init the model's arithmetic (``setup_estimate``; DDP's is eager's construction);
- forward (the measured step: SGD, no optimizer state): the unsharded parameters (gathered
  and, under ZERO2, saved for the backward) plus ACTIVATION_FACTOR x eager's forward peak on
  the same input (the float32 twin's below float32: Thunder computes low-precision chains in
  float32, and eager's own peak in the cell's dtype beside, the tensors they were cast from)
  plus what the offloading transform copied on the same device, plus on gloo the
  two largest gathered buckets (each of its two worker threads releases a finished
  all-gather's buffers late);
- backward: the forward's bound plus eager's backward peak (its full gradients included).
  Nothing for gloo: it reduce-scatters by all-reducing a full-size clone of its input (torch
  PR #118911), but makes the clone on its own thread, where the tracker (a thread-local
  dispatch mode) does not see it; NCCL reduce-scatters without a clone.

Along the plan (``against_plan.py``, walking ``liveness.py``): the measured step's forward and
backward peaks, each from what was alive when its phase began, against the walk of
Thunder's final traces (each tensor from its producer to the ``del`` of its last name; the
backward after the kit's loss, measured eagerly beside): exact on the CPU but for gloo's
late release of an all-gather's output. This judges the runtime against its plan, never the
plan: the bounds above do; and what the forward saves, against plain ``thunder.jit``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from conformance.checks import megatron
from conformance.checks.area import Area, Noise
from conformance.checks.findings import Failure, Findings
from conformance.checks.memory.against_plan import along_the_plan, saved_against_plain_jit
from conformance.checks.memory.arithmetic import (
    Terms,
    eager_peak,
    late_release,
    meta_setup,
    pytorch_parallelism,
    replicated,
    setup_estimate,
    terms,
)
from conformance.checks.memory.dataflow import estimated_returned
from conformance.checks.memory.margins import ESTIMATE_FACTOR, held_slack
from conformance.checks.memory.torch_parallel import held_after_forward, peak_bounds
from conformance.checks.record import MEASURED_STEP, CellRecord, SimulatedRecord, TensorParallelRecord
from conformance.checks.storages import allocations
from conformance.matrix.cells import DEFAULT_CHECKPOINTING

# Thunder's forward on the torch executor runs decomposed, unfused: beside each intermediate
# eager keeps, at most one more of the same size is alive, so twice eager's forward peak
# calibrated on a measurement: ci's forward peaks over the unsharded parameters, 0.4 to 2.05 x eager's float32
# peak (2026-11-22): docs/measurements.md#memory-headroom-and-estimates
ACTIVATION_FACTOR = 2


def check(run: CellRecord) -> Findings:
    found = Findings()
    memory = run.memory
    model = terms(run)
    found.metrics["terms"] = dataclasses.asdict(model)
    # a phase never measured reads zero: never shown as a measurement
    found.metrics["measured"] = {k: v for k, v in memory.peaks.items() if memory.unmeasured is None or k == "setup"}
    found.metrics["eager"] = dict(memory.eager_peaks)  # unsharded eager model, same input: for comparison

    _held_after_setup(run, model, found)

    _setup(run, model, memory.peaks["setup"], found)
    if memory.unmeasured is not None:  # setup's rows judged; the training phases never measured
        found.metrics["not judged"] = f"every row after setup: {memory.unmeasured}"
        return found

    held = _held_after_steps(run, model, found)
    if pytorch_parallelism(run):  # no single trace states what the forward keeps: storage by storage
        held_after_forward(run, model, found)
        for phase, bound in peak_bounds(run, model, ACTIVATION_FACTOR).items():
            _bounded(found, phase, memory.peaks[phase], bound, estimate=None)
        return found
    activations = eager_peak(run, "forward")
    copies = allocations(
        (s.nbytes for s in memory.saved or [] if s is not None and s.offloaded and s.device == str(run.device)),
        run.device,
    )
    # below float32 the chain runs in float32 upcast from the cell's dtype, and the tensors it
    # was cast from stay alive beside it: at most eager's own peak in that dtype (root_owned's
    # BatchNorm in bfloat16: 2.05 x its float32 peak without them, 2026-11-30)
    cast_from = memory.eager_peaks["forward"] if "float32 forward" in memory.eager_peaks else 0
    forward = model.unsharded + ACTIVATION_FACTOR * activations + cast_from + copies + late_release(run)
    backward = forward + eager_peak(run, "backward")
    traces = run.traces.by_phase()
    _held_after_forward(run, model, traces.get("forward"), found)
    planned = along_the_plan(run, traces, found)
    for phase, bound in (("forward", forward), ("backward", backward)):
        _bounded(found, phase, memory.peaks[phase], held + bound, estimate=planned.get(phase))
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
    _setup(run, model, run.memory.setup_peak, found)
    return found


def _setup_bound(run: CellRecord | SimulatedRecord, model: Terms, estimate: int) -> int:
    """Setup's bound: the estimate itself on the CPU, exact: under meta init the path Thunder's
    materialization takes (``setup_path.py``); under real init DDP's is the construction eager
    measured (DDP allocates nothing of its own), FSDP's the walk over its sharding, which the
    CPU tracker reads to the byte. On CUDA, where arithmetic stands in for a reading, a factor:
    the caching allocator may serve a tensor from a larger cached block, which its statistics
    count whole and the arithmetic does not model."""
    if torch.device(run.device).type == "cpu" or (replicated(run) and not run.init.on_meta):
        return estimate
    return int(ESTIMATE_FACTOR * estimate)


def _setup(run: CellRecord | SimulatedRecord, model: Terms, measured: int, found: Findings) -> None:
    """Setup's peak against its bound; under meta init the path's parts go to the metrics, and
    a module eager could not initialize on its own leaves the peak unbounded (a finding)."""
    if run.init.on_meta:
        path = meta_setup(run, model.resident)  # setup_estimate's, part by part
        estimate = path.peak
        found.metrics["setup path"] = dataclasses.asdict(path)
        if path.missing:
            with found.expect("memory.setup_unbounded", "setup peak", modules=path.missing):
                raise AssertionError(
                    f"eager could not initialize {path.missing} on its own (no reset_parameters), as Thunder's "
                    "materialization does: setup's peak has no bound"
                )
            return
    else:
        estimate = setup_estimate(run, model.resident)
    _bounded(found, "setup", measured, _setup_bound(run, model, estimate), estimate=estimate)


def _held_after_forward(run: CellRecord, model: Terms, forward: Any, found: Findings) -> None:
    """What the measured forward left alive, against what its trace returns (outputs and the
    tensors saved for the backward): anything more is a tensor the runtime keeps that the
    computation does not (a cache, a hook, an unsharded parameter held past its use). The
    trace states Thunder's own plan, so this judges the runtime against it, not the plan; the
    peaks, bounded from eager, judge the plan. Cells that offload are the offload area's,
    against the forward handed to the transform."""
    if run.cell.offload != "none" or forward is None:
        return
    estimate = estimated_returned(forward, run.device)
    bound = estimate + held_slack(run.device)
    alive = run.memory.alive_after_forward
    found.metrics["held after forward"] = {"measured": alive, "estimate": estimate, "bound": bound}
    with found.expect("memory.held_after_forward", "memory held after forward", held=alive):
        assert alive <= bound, (
            f"after the forward {alive} bytes it allocated are alive on {run.device}; its trace returns "
            f"{estimate} there (outputs and saved tensors): {alive - estimate} bytes kept beyond them"
        )
    zero3_saves_no_gathered(
        run, forward, model.unsharded, found, "memory.zero3_gathered_saved", "memory held after forward under ZERO3"
    )
    saved_against_plain_jit(run, forward, estimate, found)
    checkpointed_saves_inputs(run, forward, found)


def checkpointed_saves_inputs(run: CellRecord, forward: Any, found: Findings) -> None:
    """Under activation checkpointing a block saves only its inputs for the backward and
    recomputes the rest there (fixtures/checkpointing.py): what the forward leaves alive
    beside the gathered parameters it saves (its output and its activations) is bounded by
    what eager's checkpointed model leaves alive after the same forward, ACTIVATION_FACTOR
    times (Thunder's decompositions may save other tensors than eager's outside the blocks;
    the float32 twin's below float32, as the peaks'). Never read from Thunder's recompute tags:
    a Thunder that lost them saves every block's activations, and this row is what sees it."""
    if run.cell.checkpointing == DEFAULT_CHECKPOINTING:
        return
    eager = run.memory.eager_peaks
    eager_alive = eager.get("float32 alive after forward", eager["alive after forward"])
    gathered = estimated_returned(forward, run.device, gathered_only=True)
    activations = run.memory.alive_after_forward - gathered
    bound = ACTIVATION_FACTOR * eager_alive
    what = "saved for the backward under checkpointing"
    found.metrics[what] = {"measured": activations, "eager": eager_alive, "bound": bound, "gathered": gathered}
    with found.expect("memory.checkpointed_saved", what, {"bound_from_eager": bound}, saved=activations):
        assert activations <= bound, (
            f"after the forward {activations} bytes of output and activations are alive beside {gathered} bytes of "
            f"gathered parameters; eager's checkpointed model keeps {eager_alive} (its blocks' inputs and what it "
            f"saves outside them), and {ACTIVATION_FACTOR} x that is the bound: the blocks' activations were saved, "
            "not recomputed"
        )


def zero3_saves_no_gathered(
    run: CellRecord, forward: Any, unsharded: int, found: Findings, code: str, what: str
) -> None:
    """ZERO3 frees each gathered parameter after its use in the forward and gathers it again
    for the backward (``thunder.distributed.fsdp``'s docstring), so the forward saves no
    all-gather's output (nor a view of one) for the backward. ZERO2's row lets a ZERO3 that
    keeps them pass: its bytes are then the plan the runtime is judged against. Also the
    offload area's, for the forward handed to its transform."""
    if run.cell.sharding != "zero3" or replicated(run):
        return
    gathered = estimated_returned(forward, run.device, gathered_only=True)
    found.metrics[what] = {"gathered": gathered, "unsharded": unsharded}
    with found.expect(code, what, {"unsharded": unsharded}, gathered=gathered):
        assert not gathered, (
            f"gathered parameters held to the backward as under ZERO2, {gathered} bytes\n"
            f"{run.memory.alive_after_forward} bytes alive after the forward, {gathered} of them all-gathers' outputs "
            "its trace saves for the backward"
        )


def _bounded(found: Findings, phase: str, measured: int, bound: int, estimate: int | None) -> None:
    found.metrics[f"{phase} peak"] = {
        "measured": measured,
        "bound": bound,
        "bound / measured": bound / measured if measured else None,
        "estimate": estimate,  # a diagnostic: setup's from the model, the others from Thunder's traces
        "ratio": measured / estimate if estimate else None,
    }
    with found.expect("memory.peak", f"{phase} peak", {"bound": bound}, phase=phase, measured=measured):
        assert measured <= bound, f"{measured} bytes at the peak of {phase}, over the bound of {bound}"


def _held_after_setup(run: CellRecord | SimulatedRecord, model: Terms, found: Findings) -> None:
    alive = run.memory.alive_after_setup
    found.metrics["retained after setup"] = {
        "measured": alive,
        "bound": model.resident,
        "0-d storages": run.memory.scalars_after_setup,
    }
    derived = {
        "resident": model.resident,
        "buffers": model.buffers,
        "handed_over": model.handed_over,
        "resident_and_handed_over": model.resident + model.handed_over,
        "resident_and_buffers": model.resident + model.buffers,
        "unsharded": model.unsharded,
        "resident_and_unsharded": model.resident + model.unsharded,
    }
    excess = alive - model.resident
    # the cause a failure names: the state dict handed over kept whole, or something else kept
    cause = "handed_over" if model.handed_over and excess == model.handed_over else "kept"
    why = {
        "handed_over": "exactly the bytes of the state dict handed over",
        "kept": "unsharded originals or copies were kept",
    }[cause]
    fields = {"held": alive, "excess": excess, "cause": cause}
    with found.expect("memory.held_after_setup", "memory held after setup", derived, **fields):
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
        kept = model.buckets_at(k)
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
            where = {"after": when.removeprefix("after "), "step": k, "optimizer": optimizer, "held": got}
            derived = {
                "expected": expected,
                # what a known non-conformance may add: the model's parameters unsharded and
                # their gradients kept beside (a snapshot), or the activations of a forward
                "expected_and_twice_unsharded": expected + 2 * model.unsharded,
                "expected_and_activations": expected + ACTIVATION_FACTOR * eager_peak(run, "forward"),
            }
            with found.expect("memory.held", f"memory held {when} at step {k} ({optimizer})", derived, **where):
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
            with found.expect(
                "memory.optimizer_step_peak", f"optimizer step {k} ({optimizer}) peak", step=k, optimizer=optimizer
            ):
                assert got <= eager, (
                    f"the step allocated {got} bytes at its peak; {optimizer} stepping eager tensors of "
                    f"the shard shapes allocates {eager}"
                )
    return state_before(MEASURED_STEP) + model.buckets_at(MEASURED_STEP - 1)


def grown(before: Mapping[str, float], now: Findings, noise: Callable[[str], Noise]) -> list[Failure]:
    """Phases whose peak grew beyond run-to-run noise over an earlier run of the cell
    (--baseline: ``before`` is that run's metrics, each phase's peak as ``<phase> peak``)."""
    found = []
    for phase, measured in (now.metrics.get("measured") or {}).items():
        metric = f"{phase} peak"
        old = before.get(metric)
        if old is None or measured <= old:
            continue
        threshold = noise(metric)
        if threshold.beyond(old, measured):
            message = (
                f"{phase} peak grew from {old} to {measured} bytes over the baseline "
                f"(run-to-run noise: {threshold.describe()})"
            )
            found.append(Failure("memory.grown", message, {"phase": phase, "before": old, "measured": measured}))
    return found


def check_tensor_parallel(run: TensorParallelRecord) -> Findings:
    """Under tensor parallelism, what a rank holds right after setup: its shards of what the
    plan splits (as DTensor holds them: ``megatron.held_elements``), every other parameter whole,
    and the buffers (*independent*: the plan, eager's shapes and the world size), exactly on the
    CPU; nothing more."""
    found = Findings()
    wanted = megatron.placements(run.layers, list(run.shapes))
    shards = sum(
        megatron.held_elements(shape, wanted[n], run.rank, run.world_size) * run.itemsize
        for n, shape in run.shapes.items()
    )
    resident = shards + run.buffer_bytes
    alive = run.alive_after_setup
    found.metrics["retained after setup"] = {"measured": alive, "bound": resident}
    if alive is None:
        found.metrics["not judged"] = "nothing measured after setup"
        return found
    fields = {"held": alive, "excess": alive - resident, "cause": "kept"}
    derived = {"resident": resident, "buffers": run.buffer_bytes}
    with found.expect("memory.held_after_setup", "memory held after setup", derived, **fields):
        assert alive <= resident, (
            f"{alive} bytes alive, {alive - resident} more than the shards, the whole parameters the "
            f"plan leaves alone and the buffers ({resident}): whole copies of what the plan splits were kept"
        )
    return found


AREA = Area(
    "memory",
    check,
    simulated=check_simulated,
    against_baseline=grown,
    parallelisms=frozenset({"thunder", "torch"}),
    tensor_parallel=check_tensor_parallel,
)

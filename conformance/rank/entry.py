"""The rank side's entry point: build a cell once, train it beside eager PyTorch, then let
every check area that applies judge the same record.

Tracing dominates a cell's cost, so a cell is built and run exactly once per rank and the
check areas only inspect the record. The controller names ``run_cell`` in the task it hands
every rank (``conformance.rank.entry:run_cell``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import draws
from conformance.checks.findings import CellResult, identical, judged
from conformance.checks.record import DCP_API, CellRecord, MemoryRecord, PlainPlan, SetupRecord, StateDictRecord
from conformance.checks.registry import AREAS, applies
from conformance.checks.traces import final_traces
from conformance.matrix.cells import Cell
from conformance.matrix.initialization import expects_reset_error
from conformance.rank import clock, measure, progress, raised, reached
from conformance.rank.build import EagerModel, Recipe, Unsupported, build_eager_model, compose, recipe
from conformance.rank.gather import clones, cpu_copies, on_every_rank, rank_device
from conformance.rank.plain_jit import plain_plan
from conformance.rank.scenarios import run_scenario
from conformance.rank.simulate import run_simulated
from conformance.rank.tensor_parallel import run_tensor_parallel
from conformance.rank.train import generator, train
from fixtures import torch_parallel as tp
from fixtures.compositions import COMPOSITIONS

# the generator key of the buffer values the state-dict round trip loads (training's are steps)
_ROUND_TRIP_KEY = 1_000


def run_cell(
    axes: dict[str, Any], declared: Sequence[str] = (), plain_jit: bool = True, checkpoint: str | None = None
) -> dict[str, Any]:
    """Every applicable check area's findings on this rank, or why the cell could not be
    built, as JSON for the controller. ``declared``: what the xfails file declares of the
    Thunder under test in this cell (conformance/checks/declared.py); ``plain_jit``: whether
    to compile plain jit's reference (``matrix.profiles.carries_plain_jit``); ``checkpoint``:
    a resharded resume's folder, where its saving world put the checkpoint."""
    cell = Cell(**axes)
    progress.at("starting the cell")
    if cell.simulated:
        return run_simulated(cell, frozenset(declared)).to_json()
    if COMPOSITIONS[cell.composition].parallelism == "tensor":
        return run_tensor_parallel(cell, frozenset(declared)).to_json()
    areas = [area for name, area in AREAS.items() if applies(cell, name)]
    refused = expects_reset_error(cell)  # a negative cell: only its refusal is judged
    try:
        run = drive(cell, frozenset(declared), plain_jit, checkpoint)
    except Unsupported as exc:
        return CellResult(unsupported=str(exc)).to_json()
    except TypeError as exc:
        if not refused:
            raise
        return CellResult({area.name: judged(area.refusal, cell, exc) for area in areas}).to_json()
    progress.at("checks")
    if refused:
        return CellResult({area.name: judged(area.refusal, cell, None) for area in areas}, run.timings).to_json()
    return CellResult({area.name: judged(area.check, run) for area in areas}, run.timings).to_json()


def drive(
    cell: Cell, declared: frozenset[str] = frozenset(), plain_jit: bool = True, checkpoint: str | None = None
) -> CellRecord:
    """Build the cell, record its setup, train it, run its scenario, round-trip its state dict."""
    rank, world = dist.get_rank(), dist.get_world_size()
    clock.restart()
    assert world == cell.world_size, f"cell wants {cell.world_size} ranks, the world has {world}"
    progress.at("building the eager model")
    parts = dataclasses.replace(recipe(cell, rank_device()), checkpoint=checkpoint)
    eager_model = build_eager_model(parts)
    progress.at("setup")
    composed = compose(parts, eager_model)
    tm = composed.thunder_module
    progress.at("recording setup")
    alive_after_setup = measure.census(parts.device, eager_model.kit_pointers() | _bookkeeping(tm))
    setup = record_setup(parts, eager_model, tm, composed.loaded_error, composed.unwaited)
    progress.at("training")
    breaks = reached.graph_breaks()
    training = train(parts, eager_model, tm, rank, world)
    traces = final_traces(tm)  # before a scenario compiles a computation of its own
    offloading = offload_decision(composed.transforms)  # of the compilation those traces are
    # under PyTorch's parallelism the record holds the setup, the steps and DCP's state dict
    # round trip: the areas that judge it read nothing else (registry.applies)
    thunders = parts.composition.parallelism == "thunder"
    began = time.perf_counter()
    plain = reference_plan(parts) if plain_jit and thunders else None
    plain_s = time.perf_counter() - began  # a compile where this world has not met the key yet
    progress.at(f"scenario {cell.scenario}")
    scenario = run_scenario(cell.scenario, parts, eager_model, tm, training.optimizer, rank, world)
    progress.at("state dict round trip")
    state_dict = round_trip_state_dict(parts, eager_model, tm) if thunders else round_trip_dcp(parts, eager_model, tm)
    compiled = None if thunders else reached.reached_thunder(tm, breaks)
    return CellRecord(
        cell=cell,
        rank=rank,
        device=parts.device,
        dtype=parts.dtype,
        compute_dtype=parts.compute_dtype,
        backend=dist.get_backend(),
        eager_model=eager_model.module,
        thunder_module=tm,
        traces=traces,
        offload=offloading,
        setup=setup,
        steps=training.steps,
        state_dict=state_dict,
        memory=MemoryRecord(
            peaks={"setup": composed.setup_peak, **training.peaks},
            eager_peaks={"setup": eager_model.setup_peak, **training.eager_peaks},
            alive_after_setup=alive_after_setup.nbytes,
            scalars_after_setup=alive_after_setup.scalars,
            alive_after_forward=training.alive_after_forward,
            held_before_forward=training.held_before_forward,
            held_after_backward=training.held_after_backward,
            held_after_step=training.held_after_step,
            step_peaks=training.step_peaks,
            eager_step_peaks=training.eager_step_peaks,
            saved=training.saved,
            forward_held=training.forward_held,
            module_inits=eager_model.module_inits,
            loss=training.loss,
            plain=plain,
            unmeasured=measure.unmeasurable(parts.device, parts.executors),
        ),
        timings={
            "setup_s": composed.setup_s,
            **training.timings,
            "plain_jit_s": plain_s,
            "thunder_s": clock.thunder_s(),
        },
        scenario=scenario,
        declared=declared,
        reached=compiled,
    )


def _bookkeeping(tm: Any) -> set[int]:
    """Storages PyTorch's parallelism keeps for the world (``UnderTest.bookkeeping``), which the
    census leaves out with the kit's own; none under Thunder's transforms."""
    return measure.pointers(*tm.bookkeeping()) if isinstance(tm, tp.UnderTest) else set()


def reference_plan(parts: Recipe) -> PlainPlan:
    """Plain jit's plan of the cell's model, the reference for what the forward saves (where
    the cell offloads, for the forward Thunder handed the offloading transform). Plain jit
    raising is the Thunder under test's failure, recorded for the memory area to report."""
    progress.at("plain jit")
    return plain_plan(parts)


def offload_decision(transforms: list[Any]) -> Any:
    """The offloading transform's decision for the last forward it was handed (None: the cell
    does not offload, or Thunder never handed it a forward)."""
    from transforms.offload import OffloadTransform

    decisions = [d for t in transforms if isinstance(t, OffloadTransform) for d in t.decisions]
    return decisions[-1] if decisions else None


def record_setup(
    parts: Recipe, eager_model: EagerModel, tm: Any, loaded_error: str | None = None, unwaited: list[str] | None = None
) -> SetupRecord:
    """What the Thunder module holds right after setup. Where Thunder drew the weights
    (module init; a partly-meta model's fresh part), or a state dict's load raised
    (``loaded_error``: materialization's finding), the eager model adopts them so that the
    steps can be compared: a loaded weight Thunder changed is then numerics' finding too."""
    placement = {n: str(t.device) for n, t in (*tm.named_parameters(), *tm.named_buffers())}
    buffers = cpu_copies(tm.named_buffers())
    on_ranks = on_every_rank(buffers)
    setup = SetupRecord(
        placement=placement,
        initial=eager_model.gather(tm),
        eager_initial=eager_model.initial,
        buffers=buffers,
        eager_buffers=cpu_copies(eager_model.module.named_buffers()),
        buffers_unlike_rank0=sorted(n for n, t in buffers.items() if not identical(t, on_ranks[0].get(n))),
        loaded_error=loaded_error,
        unwaited=list(unwaited or ()),
    )
    # what Thunder drew (None: every tensor), the values eager adopts; after a raised load,
    # whatever the module holds
    drawn = None if loaded_error is not None else parts.drawn_by_thunder()
    if drawn is None or drawn:
        with torch.no_grad():
            for n, p in eager_model.module.named_parameters():
                if drawn is None or n in drawn:
                    p.copy_(setup.initial[n])
            # buffers eager draws at random were drawn by Thunder too (checked by materialization)
            for n in draws.buffer_expectations(parts.make):
                if drawn is not None and n not in drawn:
                    continue
                if n in buffers and buffers[n].shape == eager_model.module.get_buffer(n).shape:
                    eager_model.module.get_buffer(n).copy_(buffers[n])
    return setup


def round_trip_state_dict(parts: Recipe, eager_model: EagerModel, tm: Any) -> StateDictRecord:
    """Last, as it rewrites the module's weights: ``original_state_dict()`` after training,
    then the initial weights loaded back through ``load_original_state_dict()``."""
    original = cpu_copies(tm.original_state_dict().items())
    gathered = eager_model.gather(tm)
    buffers = cpu_copies(tm.named_buffers())
    loaded = {n: t.to(parts.device) for n, t in eager_model.initial.items()}
    every_name = {n for n, _ in eager_model.module.named_parameters(remove_duplicate=False)}  # a tie's too
    known = _known_buffers(eager_model.module.state_dict(), every_name, parts.device)
    tm.load_original_state_dict({**clones(eager_model.module.state_dict()), **known, **loaded})
    return StateDictRecord(
        original=original,
        buffers=buffers,
        eager_model=cpu_copies(eager_model.module.state_dict().items()),
        loaded={n: t.cpu() for n, t in loaded.items()},
        reloaded=eager_model.gather(tm),
        gathered=gathered,
        loaded_buffers=cpu_copies(known.items()),
        reloaded_buffers={n: b for n, b in cpu_copies(tm.named_buffers()).items() if n in known},
    )


def round_trip_dcp(parts: Recipe, eager_model: EagerModel, composed: Any) -> StateDictRecord:
    """Under PyTorch's parallelism, the round trip through torch.distributed.checkpoint's full
    state dict, as a user saves and loads one: ``get_model_state_dict`` after training, then the
    initial weights, under eager's keys, through ``set_model_state_dict``. What either raises
    is recorded for the state_dict area, not raised: the other areas' judgment stands."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    full = StateDictOptions(full_state_dict=True)
    original, taken_error = {}, None
    try:
        original = cpu_copies(get_model_state_dict(composed.model, options=full).items())
    except Exception as exc:  # Thunder's module under DCP: a finding, named
        taken_error = raised.named(exc)
    gathered = eager_model.gather(composed)
    buffers = cpu_copies(composed.named_buffers())
    loaded = {n: t.to(parts.device) for n, t in eager_model.initial.items()}
    every_name = {n for n, _ in eager_model.module.named_parameters(remove_duplicate=False)}
    known = _known_buffers(eager_model.module.state_dict(), every_name, parts.device)
    loaded_error = None
    try:
        # every name of a tied weight holds its initial value: DCP loads each key, the last wins
        first = {id(p): n for n, p in eager_model.module.named_parameters()}
        named = eager_model.module.named_parameters(remove_duplicate=False)
        tied = {n: loaded[first[id(p)]] for n, p in named if first[id(p)] in loaded}
        handed = {**clones(eager_model.module.state_dict()), **known, **tied}
        set_model_state_dict(composed.model, handed, options=full)
    except Exception as exc:
        loaded_error = raised.named(exc)
    return StateDictRecord(
        original=original,
        buffers=buffers,
        eager_model=cpu_copies(eager_model.module.state_dict().items()),
        loaded={n: t.cpu() for n, t in loaded.items()},
        reloaded=eager_model.gather(composed) if loaded_error is None else {},
        gathered=gathered,
        loaded_buffers=cpu_copies(known.items()),
        reloaded_buffers={n: b for n, b in cpu_copies(composed.named_buffers()).items() if n in known},
        api=DCP_API,
        taken_error=taken_error,
        loaded_error=loaded_error,
    )


def _known_buffers(
    state: dict[str, torch.Tensor], parameters: set[str], device: torch.device
) -> dict[str, torch.Tensor]:
    """Values for the persistent buffers of the eager state dict (its entries that are no
    parameter) that neither module holds, so that a buffer left as it was cannot pass for
    loaded: drawn from the kit's seed, the same on every rank; floats in [0.5, 1.5) (a
    running variance stays one), integers in [1000, 2000)."""
    gen = generator(_ROUND_TRIP_KEY)
    known = {}
    for name, t in state.items():
        if name in parameters or not isinstance(t, torch.Tensor):
            continue
        if t.is_floating_point():
            value = torch.rand(t.shape, generator=gen).to(t.dtype) + 0.5
        elif t.dtype == torch.bool:
            value = torch.rand(t.shape, generator=gen) < 0.5
        else:
            value = torch.randint(1000, 2000, t.shape, generator=gen).to(t.dtype)
        known[name] = value.to(device)
    return known

"""The memory area's rows for PyTorch's parallelism's cells, where FSDP2 or DDP own the
collectives and Thunder compiles (``fixtures/torch_parallel.py``). Setup, every backward and
every step are held exactly as for Thunder's own transforms (``memory/__init__.py``); the
forward has no single trace that states what it keeps, so it is read storage by storage
(``conformance/rank/held.py``) and its peaks are bounded by FSDP2's and DDP's own design.

- **Held after the forward = what its autograd graph holds** (exact, CPU): every storage the
  forward allocated and left alive is held by the output's autograd graph (the output, every
  tensor a node saved for the backward) or is a registered parameter (FSDP2's unsharded
  parameters, where it keeps them after the forward). *Self-consistency*: the graph is the
  runtime's own plan of what the backward reads; a storage beyond it is a cache, a hook's or a
  compiled graph's own state.
- **No copy of a parameter** (exact, CPU): no storage the forward allocated holds a parameter's
  values or its transpose, in its dtype or float32, but the parameter's own registered storage.
  FSDP2 frees an unsharded parameter after its unit's forward by resizing its storage to
  nothing (``reshard_after_forward``), which a saved reference does not keep alive; a copy
  does, and eager PyTorch saves none. *Independent*: held to the model's parameters.
- **Peaks** (bounded): the forward allocates at most every unit's gathered parameters (U, as if
  none were resharded), one unit's flat all-gather buffer more while FSDP2 copies it out (plus,
  on gloo, one per worker thread released late: ``arithmetic.GLOO_THREADS``), and
  ACTIVATION_FACTOR x eager's forward peak; the backward, that and eager's backward peak and one
  unit's reduce-scatter input (FSDP2 reduce-scatters a copy of a unit's padded gradients). DDP
  gathers nothing: activations only, its buckets held from setup. *Independent*.
"""

from __future__ import annotations

from conformance.checks.findings import Findings
from conformance.checks.fsdp2 import gathered_units
from conformance.checks.memory.arithmetic import GLOO_THREADS, Terms, eager_peak, replicated
from conformance.checks.record import MEASURED_STEP, CellRecord
from conformance.checks.storages import allocations
from fixtures.compositions import COMPOSITIONS
from fixtures.options import MIXED


def units(run: CellRecord) -> list[int]:
    """Per FSDP2 unit that manages any storage, the bytes its gathered parameters take on the
    rank's device (each parameter its own allocation, as FSDP2 copies them out); none under DDP."""
    if replicated(run):
        return []
    mixed, wrap = MIXED.get(run.cell.dtype), COMPOSITIONS[run.cell.composition].fsdp2_wrap
    gathered = gathered_units(run.eager_model, run.cell.world_size, mixed, wrap)
    return [allocations(unit, run.device) for unit in gathered]


def rebuilt_buckets(model: Terms) -> int:
    """DDP's buckets PyTorch's DDP rebuilds in the measured step's forward (``arithmetic.Terms``):
    held by its reducer, not by the autograd graph."""
    return model.gradient_buckets if model.buckets_from_step == MEASURED_STEP else 0


def peak_bounds(run: CellRecord, model: Terms, activation_factor: int) -> dict[str, int]:
    """The forward's and the backward's bounds, over what the rank held when the measured step
    began (as measured: what it holds beyond the model is the held rows' to judge)."""
    gathered = units(run)
    largest = max(gathered, default=0)
    late = GLOO_THREADS if run.backend == "gloo" else 0
    activations = activation_factor * eager_peak(run, "forward")
    forward = sum(gathered) + (1 + late) * largest + rebuilt_buckets(model) + activations
    backward = forward + eager_peak(run, "backward") + largest
    held = run.memory.held_before_forward
    return {"forward": held + forward, "backward": held + backward}


def held_after_forward(run: CellRecord, model: Terms, found: Findings) -> None:
    """The forward's storages against what holds them, and no copy of a parameter among them."""
    held = run.memory.forward_held
    if held is None:  # CUDA: the allocator counts bytes, not storages
        found.metrics["not judged"] = "what the forward left alive: storages are read one by one on the CPU only"
        return
    rebuilt = rebuilt_buckets(model)
    # as Thunder's cells report it (measured, estimate, bound), the estimate here what the
    # autograd graph and the registered parameters hold
    found.metrics["held after forward"] = {
        "measured": held.alive,
        "estimate": held.graph,
        "bound": held.graph + rebuilt,
        "unheld storages": held.unheld,
        "DDP's buckets rebuilt": rebuilt,
        "parameter copies": held.copies,
        "eager's parameter copies": held.eager_copies,
    }
    beyond = sum(held.unheld) - rebuilt
    derived = {"graph": held.graph, "rebuilt_buckets": rebuilt}
    with found.expect("memory.held_beyond_graph", "memory held after forward", derived, held=held.alive):
        assert beyond <= 0, (
            f"after the forward {held.alive} bytes it allocated are alive; the output's autograd graph and the "
            f"registered parameters hold {held.graph}"
            + (f", DDP's rebuilt buckets {rebuilt}" if rebuilt else "")
            + f": {beyond} bytes kept beyond them (storages of {held.unheld} bytes)"
        )
    beyond_eager = {n: b for n, b in held.copies.items() if b > held.eager_copies.get(n, 0)}
    what, named = "parameter copies after forward", sorted(beyond_eager)
    with found.expect("memory.parameter_copy", what, parameters=named, eager=sorted(held.eager_copies)):
        assert not beyond_eager, (
            "the forward left alive copies of "
            + ", ".join(f"{name} ({nbytes} bytes)" for name, nbytes in sorted(beyond_eager.items()))
            + ": a copy outlives the unit's resharding, and eager PyTorch's forward keeps "
            + (", ".join(f"{n} ({b} bytes)" for n, b in sorted(held.eager_copies.items())) or "none")
        )

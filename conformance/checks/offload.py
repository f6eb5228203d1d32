"""Offloading: what the reference offloading transform (transforms/offload.py) promises,
checked on Thunder's final traces and on what autograd holds between forward and backward.

Every expectation comes from the policy and the forward trace Thunder handed the transform
(its ``Decision``: what the forward saves and returns before any offload), never from the
final trace, so a Thunder pass after the transform cannot widen what it is judged against.

- selection: the saved tensors the policy selects among the intermediates that forward saves,
  and only those, are held offloaded (in storages the transform created; on the destination
  device where it is not the source). The final trace names what autograd holds (each offload's
  input in place of its copy);
- forward placement: every offload comes after the last forward use of its tensor, and the
  forward saves the copy instead of the original;
- backward placement: every copy is loaded in the backward before the loaded tensor's first
  use, and nothing but its load reads the copy;
- residency: between forward and backward a rank holds on its device at most what the handed
  forward returns there (outputs and saved tensors), less what the policy moved to another
  device, exactly on the CPU (on CUDA each tensor rounded up to the allocator's 512-byte
  blocks, as its statistics count them, and one block more: ``margins.held_slack``); a kept
  gathered parameter counts its padded all-gather, of which it is a view. On CPU to CPU the
  copies replace their originals byte for byte.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.checks.area import Area
from conformance.checks.findings import Findings
from conformance.checks.memory import zero3_saves_no_gathered
from conformance.checks.memory.against_plan import saved_against_plain_jit
from conformance.checks.memory.arithmetic import terms
from conformance.checks.memory.dataflow import estimated_returned
from conformance.checks.memory.margins import held_slack
from conformance.checks.record import CellRecord
from conformance.checks.storages import allocations
from conformance.checks.traces import MISSING
from fixtures.offloads import POLICIES
from transforms.policies import proxy_bytes

SHOWN = 5  # names listed in a failure
NEVER_HANDED = "Thunder never handed the offloading transform a forward trace (transform_trace_post_optimization)"


def _names(names: set[str]) -> str:
    shown = sorted(names)[:SHOWN]
    return ", ".join(shown) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _readers(trace: Any, name: str, ignore: set[Any]) -> list[tuple[int, Any]]:
    return [
        (i, b)
        for i, b in enumerate(trace.bound_symbols)
        if b.sym.id not in ignore and any(getattr(a, "name", None) == name for a in b.flat_proxy_args)
    ]


def saved_without_offloading(forward: Any) -> tuple[list[Any], list[Any]]:
    """(what the final forward trace saves for backward, the same with each offloaded copy
    replaced by the tensor it was copied from: what the forward would save without offloading)."""
    from thunder.core.vjp_utils import get_saved_for_backward_tensors

    from transforms.offload import offload

    original_of = {b.output.name: b.args[0] for b in forward.bound_symbols if b.sym.id == offload.id}
    final = list(get_saved_for_backward_tensors(forward))
    return final, [original_of.get(t.name, t) if t is not None else None for t in final]


def check(run: CellRecord) -> Findings:
    from thunder.core.prims import PrimIDs
    from thunder.core.vjp_utils import get_saved_for_backward_tensors
    from thunder.executors.pythonex import clear_mutable_collection

    from transforms.offload import load, offload, saved_intermediates

    found = Findings()
    policy = POLICIES[run.cell.offload]
    traces = run.traces
    forward, backward = traces.forward, traces.backward
    if forward is None or backward is None:  # nothing to read the plan from
        phase = "forward" if forward is None else "backward"
        found.fail("offload.trace_missing", f"saved tensors offloaded: {MISSING.format(phase)}", phase=phase)
        return found
    autograd_saved = run.memory.saved
    offloads = {b.output.name: (i, b) for i, b in enumerate(forward.bound_symbols) if b.sym.id == offload.id}
    final_saved, saved = saved_without_offloading(forward)
    # the handed forward: what this compilation would save and return without offloading
    handed = run.offload.forward if run.offload is not None else None
    candidates, chosen = [], []
    if handed is not None:
        candidates = saved_intermediates(handed, list(get_saved_for_backward_tensors(handed)), run.device)
        chosen = list(policy.select(candidates, handed))
    expected = {t.name for t in chosen}

    with found.expect("offload.selected", "saved tensors offloaded"):
        assert handed is not None, NEVER_HANDED
        assert autograd_saved is not None, "the output has no autograd node holding saved tensors"
        assert len(autograd_saved) == len(saved), (
            f"autograd holds {len(autograd_saved)} saved tensors, the forward trace saves {len(saved)}"
        )
        pairs = list(zip(saved, autograd_saved, strict=True))
        actual = {t.name for t, kept in pairs if kept is not None and kept.offloaded}
        found.metrics["offloaded"] = {
            "candidates": len(candidates),
            "expected": len(expected),
            "actual": len(actual),
            "bytes": sum(kept.nbytes for kept in autograd_saved if kept is not None and kept.offloaded),
        }
        assert actual == expected, (
            f"policy {run.cell.offload} selects {len(expected)} of {len(candidates)} saved intermediates; "
            f"between forward and backward {len(actual)} are offloaded "
            f"(not offloaded: {_names(expected - actual) or '-'}; "
            f"offloaded unasked: {_names(actual - expected) or '-'})"
        )
        if str(run.device) != "cpu":  # the destination is the CPU: offloaded tensors must have left
            on_source = {t.name for t, kept in pairs if kept is not None and kept.device == str(run.device)}
            assert not (actual & on_source), f"offloaded tensors still on {run.device}: {_names(actual & on_source)}"

    with found.expect("offload.read_after_offload", "offload after the last forward use"):
        saved_names = {t.name for t in final_saved if t is not None}
        for copy, (at, bsym) in offloads.items():
            original = bsym.args[0].name
            later = _readers(forward, original, {PrimIDs.DEL, PrimIDs.RETURN})
            late = [f"{b.sym.name} (line {i})" for i, b in later if i > at]
            assert not late, f"{original} is offloaded at bound symbol {at} but read afterwards by {', '.join(late)}"
            assert original not in saved_names, f"the forward saves {original} beside its offloaded copy {copy}"

    with found.expect("offload.load_order", "load before the first backward use"):
        loads = {b.args[0].name: (i, b) for i, b in enumerate(backward.bound_symbols) if b.sym.id == load.id}
        never = set(offloads) - set(loads)
        assert not never, f"offloaded in the forward but never loaded in the backward: {_names(never)}"
        distances = []
        for copy, (at, bsym) in loads.items():
            direct = _readers(backward, copy, {PrimIDs.DEL, clear_mutable_collection.id, load.id})
            assert not direct, f"{direct[0][1].sym.name} (line {direct[0][0]}) reads the offloaded {copy} itself"
            users = _readers(backward, bsym.output.name, {PrimIDs.DEL, clear_mutable_collection.id})
            assert users, f"{bsym.output.name} is loaded but never used"
            first = users[0][0]
            assert first > at, f"{bsym.output.name} is used at line {first} before its load at line {at}"
            distances.append(first - at)
        found.metrics["load distance"] = {"max": max(distances, default=0), "loads": len(loads)}

    if run.memory.unmeasured is not None:  # the one row that reads a measurement
        found.metrics["not judged"] = f"held between forward and backward: {run.memory.unmeasured}"
    else:
        with found.expect("offload.held", "held between forward and backward"):
            assert handed is not None, NEVER_HANDED
            # what the handed forward returns, each chosen tensor replaced by its copy: the
            # original's storage goes unless a view of it is returned too or it is an input's (a
            # saved transposed weight); the copies are new storages, on this device where the
            # destination is this device (the CPU)
            copies = allocations(map(proxy_bytes, chosen), run.device) if torch.device(run.device).type == "cpu" else 0
            estimate = estimated_returned(handed, run.device, not_returned=expected) + copies
            alive = run.memory.alive_after_forward
            bound = estimate + held_slack(run.device)
            found.metrics["held after forward"] = {"measured": alive, "estimate": estimate, "bound": bound}
            assert alive <= bound, (
                f"after the forward {alive} bytes it allocated are alive on {run.device}; the forward Thunder handed "
                f"the transform returns {estimate} there (outputs and saved tensors, {len(chosen)} of them as their "
                "offloaded copies): offloaded originals were kept"
            )
    if handed is not None:
        unsharded = terms(run).unsharded
        what = "held between forward and backward under ZERO3"
        zero3_saves_no_gathered(run, handed, unsharded, found, "offload.zero3_gathered_saved", what)
        # the forward before offloading is the plan plain jit's is the reference for
        saved_against_plain_jit(run, handed, estimated_returned(handed, run.device), found)
    return found


AREA = Area("offload", check, applies=lambda cell: cell.offload != "none")

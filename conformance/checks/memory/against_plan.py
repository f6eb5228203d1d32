"""The memory area's rows held to a plan rather than to the model's arithmetic: the
measured step's peaks against the plan of Thunder's final traces (the runtime judged
against its own plan, ``liveness.py``), and what the forward plans to save against plain
``thunder.jit`` of the same model (the plan judged against a reference no distributed
transform touched, ``rank/plain_jit.py``). The area (``__init__.py``) runs both beside its bounds."""

from __future__ import annotations

from typing import Any

import torch

from conformance.checks.findings import Findings
from conformance.checks.memory.arithmetic import GLOO_THREADS, late_release, replicated
from conformance.checks.memory.dataflow import estimated_returned, tensor_proxies
from conformance.checks.memory.liveness import Walk, handed_to_backward, sized, walk
from conformance.checks.record import CellRecord
from conformance.checks.storages import allocations, distinct_storages, padded_bytes


def along_the_plan(run: CellRecord, traces: dict[str, Any], found: Findings) -> dict[str, int]:
    """The measured step's forward and backward peaks against the plan of Thunder's final
    traces (``plan.walk``): each phase from what was alive when it began. The forward's
    plan is its trace's. The backward phase is the kit's loss and autograd's way back to the
    output (measured eagerly beside, ``record.LossRegion``), then Thunder's backward from
    what was alive when the gradient reached it, owning the tensors its forward saved and
    the gradient. On the CPU the runtime allocates exactly along the plan; more is a tensor
    it keeps longer than the plan, or a copy the plan does not make. Returns each phase's
    planned peak from the ledger's zero (the bounds' diagnostic)."""
    memory, forward, backward = run.memory, traces.get("forward"), traces.get("backward")
    if forward is None or backward is None or memory.loss is None:
        return {}
    device = torch.device(run.device)
    walked = None
    with found.expect("memory.plan_unreadable", "peaks along the plan"):
        try:  # a trace the walk cannot read is what Thunder produced, named; never the kit's crash
            f = walk(forward, device)
            walked = f, walk(backward, device, handed_to_backward(f, device))
        except Exception as exc:
            raise AssertionError(f"Thunder's final traces cannot be walked: {type(exc).__name__}: {exc}") from exc
    if walked is None:
        return {}
    f, b = walked
    began = {"forward": memory.held_before_forward, "backward": memory.held_before_forward + memory.alive_after_forward}
    plans = {"forward": (f, f.peak), "backward": (b, max(memory.loss.peak, memory.loss.handed + b.peak))}
    planned = {}
    for phase, (along, plan) in plans.items():
        rise = memory.peaks[phase] - began[phase]
        # each of gloo's worker threads lets go of a finished all-gather's output a moment after
        # ``wait()`` returns: in a phase that gathers, the model's largest gathered units, one
        # per thread (``memory_terms.late_release``, as the forward's bound allows them), may
        # outlive their ``del``
        late = late_release(run) if along.largest_gathered else 0
        planned[phase] = began[phase] + plan
        with found.expect("memory.plan_frees_late", f"{phase} plan frees at last use", phase=phase):
            # the trace read against its own data flow, on every device (no allocator involved).
            # Per tensor, not only at the peak: the kit's models are small, so their peaks sit
            # where the parameters are gathered; a real model's sit where a late free shows
            assert not along.late, (
                f"the {phase}'s trace keeps tensors past their last use across allocations (its peak "
                f"{along.peak - along.prompt_peak} bytes over the same trace freeing each at its last use): "
                + "; ".join(along.late[:4])
                + (f"; {len(along.late) - 4} more" if len(along.late) > 4 else "")
            )
        found.metrics[f"{phase} peak along the plan"] = {
            "measured": rise,
            "plan": plan,
            "gloo's late release": late,
            "matmul copies allowed": along.folding_at_peak,
            "freed at last use": along.prompt_peak,
            "at the plan's peak": along.at_peak,
        }
        if device.type != "cpu":
            continue  # reported only: the caching allocator's and NCCL's allocations are not modelled yet
        with found.expect("memory.plan_peak", f"{phase} peak along the plan", phase=phase, excess=rise - plan):
            excess = rise - plan
            named = ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in sized(along, excess))
            assert excess <= late, (
                f"the {phase} allocated {rise} bytes at its peak, {excess} more than its trace's plan ({plan})"
                + (f" and gloo's late release of its {GLOO_THREADS} largest all-gathers ({late})" if late else "")
                + ": the runtime keeps a tensor longer than the plan or copies one it does not"
                + (f"; the plan drops tensors of exactly that size: {named}" if named else "")
            )
    if device.type == "cpu" and not replicated(run):
        shards_returned_uncopied(backward, b, found)
    return planned


def shards_returned_uncopied(backward: Any, b: Walk, found: Findings) -> None:
    """FSDP's arithmetic for the backward's gradients: each is reduce-scattered into a shard,
    and that shard is the gradient the backward returns (its storage, viewed at most). A
    gradient returned from any other storage is a copy the plan makes of a shard, one
    shard's bytes more while both live. On the CPU only: a fusion executor may produce the
    returned views inside a region."""
    from thunder.core.prims import PrimIDs

    with found.expect("memory.backward_copies_reductions", "backward returns its reduce-scatters' outputs"):
        returns = [bsym for bsym in backward.bound_symbols if bsym.sym.id == PrimIDs.RETURN]
        assert len(returns) == 1, f"the backward trace has {len(returns)} return statements, not one"
        [ret] = returns
        copied = []
        for grad in tensor_proxies(ret.flat_proxy_args):
            storage = b.allocated.get(b.owners.get(grad.name, ""))
            if storage is None:
                copied.append(f"{grad.name} {list(grad.shape)}, a storage the backward did not allocate")
            elif storage.collective != "reduce_scatter":
                by = storage.collective or "no collective"
                copied.append(f"{grad.name} {list(grad.shape)}, allocated by bound symbol {storage.born} ({by})")
        assert not copied, "it returns gradients that are not its reduce-scatters' outputs: " + "; ".join(copied)


def saved_against_plain_jit(run: CellRecord, forward: Any, total: int, found: Findings) -> None:
    """What the distributed forward plans to keep for the backward, against plain
    ``thunder.jit`` of the same model on the same rank, dtype and executors
    (``rank/plain_jit.py``): every tensor it allocates and returns but the all-gathers' outputs
    (the output and the activations it saves) equals plain jit's, whose plan no distributed
    transform touched; under FSDP's ZERO2 the gathered parameters it saves are the
    parameters plain jit saves, each padded to the world size (ZERO3's are ``memory.zero3_saves_no_gathered``'s).
    A transform that saves an activation twice, or keeps a gathered parameter plain jit
    does not need, changes the plan itself, which the runtime then matches to the byte.
    ``total``: what the forward's plan allocates and returns (the held-after-forward row's estimate)."""
    plain = run.memory.plain
    if plain is None:
        return
    what = "saved for the backward against plain jit"
    with found.expect("memory.saved_against_plain_jit", what):
        assert plain.error is None, f"plain thunder.jit of the same model raised: {plain.error}"
        gathered = estimated_returned(forward, run.device, gathered_only=True)
        storages = distinct_storages(run.eager_model)
        expected_gathered = 0
        if not replicated(run) and run.cell.sharding != "zero3":
            expected_gathered = allocations(
                (padded_bytes(storages[n], run.cell.world_size) for n in plain.saved_parameters if n in storages),
                run.device,
            )
        found.metrics[what] = {
            "activations": total - gathered,
            "plain jit": plain.returned,
            "gathered": gathered,
            "expected gathered": expected_gathered,
            "plain jit saves": plain.saved_parameters,
        }
        if torch.device(run.device).type != "cpu":
            # reported only: a fusion executor's rematerialization may choose what to save
            # around the collectives differently, and no GPU has run this row yet
            return
        problems = []
        if total - gathered != plain.returned:
            problems.append(
                f"its forward returns {total - gathered} bytes it allocated beside gathered parameters "
                f"(the output and the activations it saves); plain jit's returns {plain.returned}"
            )
        if run.cell.sharding != "zero3" and gathered != expected_gathered:
            problems.append(
                f"it saves {gathered} bytes of gathered parameters; plain jit saves {plain.saved_parameters}, "
                f"{expected_gathered} bytes padded to {run.cell.world_size} ranks"
            )
        assert not problems, "; ".join(problems)

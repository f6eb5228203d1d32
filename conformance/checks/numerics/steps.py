"""Numerics' step loop: every kind of comparison at every training step, each reporting the
first step where it fails, then the dropout, the scenario and the tied parameters."""

from __future__ import annotations

import torch

from conformance.checks.findings import Findings
from conformance.checks.numerics.dropout import judge_dropout
from conformance.checks.numerics.propagation import judge_update, propagated_per_parameter
from conformance.checks.numerics.replicas import judge_replicas
from conformance.checks.numerics.scale import judge_gradient_scale, scale_constants
from conformance.checks.numerics.scenarios import judge_scenario
from conformance.checks.numerics.tolerances import Local, Tensors, compare, drift_effect, named_output
from conformance.checks.record import CellRecord, StepRecord
from conformance.checks.storages import tie_groups
from fixtures.compositions import COMPOSITIONS
from fixtures.inits import INITS
from fixtures.models import MODELS


def check(run: CellRecord) -> Findings:
    found = Findings()
    # below float32 (what the cell computes in) tolerances come from eager's own error against
    # the float32 twin; outputs and gradients are rounded in the compute dtype, the parameters
    # stored and updated in the model's (they differ under FSDP2's mixed precision, where the
    # reductions' roundings are taken in the compute dtype too: a bound above its float32 ones)
    dtype, held = run.computes_in, run.dtype
    low = dtype != torch.float32
    before = run.before
    failed: set[str] = set()  # kinds already failing: only the first step is reported
    stage: list[StepRecord] = []  # the steps of the optimizer now stepping (each starts fresh)
    # per parameter: what the optimizer made of gradients off as far as eager's, this step and
    # summed over the steps so far (Thunder's parameters may drift from the twin's by the sum)
    moved: dict[str, torch.Tensor] = {}
    drift: dict[str, torch.Tensor] = {}
    constants = scale_constants(run.cell)
    # each rank's rows where they are its shard (FSDP's), not where every rank holds all
    replicated = COMPOSITIONS[run.cell.composition].replicated
    shards = 1 if replicated else run.cell.world_size
    for k, step in enumerate(run.steps):
        stage = [*stage, step] if stage and stage[-1].optimizer == step.optimizer else [step]
        if low:
            moved = propagated_per_parameter(stage, step.after.twin or {}, dtype, run.cell.world_size)
            drift = {n: drift[n] + m if n in drift else m for n, m in moved.items()}
        twin_step, at_thunder = step.twin, step.twin_at_thunder  # below float32 only
        twin_output = named_output(twin_step.output) if twin_step is not None else None
        twin_grads = twin_step.grads if twin_step is not None else None
        kinds: dict[str, tuple[Tensors, Tensors, Tensors | None]] = {
            "output": ({"output": step.output}, {"output": step.eager.output}, twin_output),
            "gradients": (step.grads, step.eager.grads, twin_grads),
            "parameters": (step.after.thunder, step.after.eager_model, step.after.twin),
            # what the forward made of this rank's buffers (running statistics): from this
            # rank's micro-batches alone
            "buffers": (step.buffers, step.eager.buffers, twin_step.buffers if twin_step is not None else None),
        }
        # below float32, what the parameters' drift so far makes of this step's output and
        # gradients (the twin at Thunder's weights against the twin at its own): allowed on top
        allowed: dict[str, Tensors | None] = {"parameters": drift}
        if low:
            at_thunder_output = named_output(at_thunder.output) if at_thunder is not None else None
            allowed["output"] = drift_effect(at_thunder_output, twin_output)
            allowed["gradients"] = drift_effect(at_thunder.grads if at_thunder is not None else None, twin_grads)
        # below float32, gradients may also stray as far as eager's own when each rank's is
        # computed alone (rounded per rank, as a data-parallel rank rounds it before reducing)
        at_thunder_grads = at_thunder.grads if at_thunder is not None else None
        local = Local.of(step.local_at_thunder, at_thunder_grads, run.cell.world_size - 1, dtype)
        # a parameter eager trains that got no gradient from Thunder at all (no rank's shard):
        # its update, every later output and step follow from that alone, so the loop reports
        # the missing gradients and ends there, saying what it left unjudged
        lost = sorted(set(step.eager.grads) - set(step.grads))
        if lost:
            kinds = {k: v for k, v in kinds.items() if k in ("output", "gradients")}
        for kind, (actual, expected, twin) in kinds.items():
            if kind in failed:
                continue
            what = f"{kind} at step {k} ({step.optimizer})"
            per_rank = local if kind == "gradients" else None
            # a buffer the forward updates (running statistics, r' = (1 - m) r + m x) may be
            # rounded three times at each of the k + 1 updates so far (the batch statistic x,
            # the decayed r, their sum) by a decomposition, where eager's fused kernel rounds
            # once: its floor is that many roundings of the twin's value
            # calibrated on a measurement: a running mean 2.06 and 2.2 x eager's distance at 3 and 4 ranks in
            # nightly (2026-11-23): docs/measurements.md#numerics-the-cells-behind-the-allowances
            roundings = 3 * (k + 1) if kind == "buffers" else 1
            fields = {"quantity": kind, "step": k, "optimizer": step.optimizer}
            rounded = held if kind == "parameters" else dtype
            allowance = allowed.get(kind)
            if not compare(
                found, what, actual, expected, twin, rounded, allowance, per_rank, roundings, fields, fixed=not low
            ):
                failed.add(kind)
        if lost:
            found.metrics["not judged"] = (
                f"everything after the gradients of step {k} ({step.optimizer}): {len(lost)} parameters got no "
                f"gradient from Thunder ({', '.join(lost[:5])}{', ...' if len(lost) > 5 else ''}), and every "
                "later comparison follows from that"
            )
            break
        if low and "update" not in failed and not judge_update(found, k, stage, before, held, moved):
            failed.add("update")
        # the same gradients one precision up: what the dtype's roundings did to eager's
        float64 = step.float64_at_thunder
        reference = at_thunder_grads if low else (float64.grads if float64 is not None else None)
        if "gradient scale" not in failed and step.local_at_thunder is not None and reference is not None:
            what = f"gradient scale at step {k} ({step.optimizer})"
            additions = run.cell.world_size - 1
            if not judge_gradient_scale(
                found,
                what,
                step.grads,
                step.local_at_thunder,
                reference,
                dtype,
                constants,
                additions,
                shards,
                {"step": k, "optimizer": step.optimizer},
            ):
                failed.add("gradient scale")
        if replicated:  # DDP: every rank's whole replica must stay rank 0's, bit for bit
            judge_replicas(found, k, step, failed)
        before = step.after

    fixture = MODELS.get(run.cell.model)
    if fixture is not None and fixture.output_dropout is not None:
        # every rank's masks where recorded (the same on every rank), else this rank's outputs
        masks = [s.dropout_masks or [s.output != 0] for s in run.steps]
        # the kit seeds the ranks apart only under the inits that broadcast (conformance/rank/build.py)
        judge_dropout(found, masks, fixture.output_dropout, seeded_apart=INITS[run.cell.init].broadcast)
    if run.scenario is not None:
        judge_scenario(found, run.scenario, dtype, run.cell.world_size)

    # Tied names must resolve to one parameter: one shard, one gradient, one update.
    for group in tie_groups(run.eager_model):
        with found.expect("numerics.tie_broken", f"tied parameters {group}", names=list(group)):
            distinct = {id(run.thunder_module.get_parameter(n)) for n in group}
            assert len(distinct) == 1, f"the Thunder module holds {len(distinct)} distinct tensors for one tied weight"
    return found

"""``reshape``: one forward and backward of the Thunder module on inputs of a second shape
(the model fixture's ``second_input``: another batch size or sequence length). Thunder
caches a computation per input shape, so this compiles a second one, and the FSDP transform
must shard, gather and reduce in it exactly as in the first: its output and gradients
against eager's, its collectives counted like the training's."""

from __future__ import annotations

from typing import Any

from conformance.checks.record import ScenarioRecord
from conformance.checks.traces import final_traces
from conformance.rank.build import Recipe, Reference
from conformance.rank.eager import loss, rank_gradients
from conformance.rank.scenarios.beside import AFTER_TRAINING, Batch, Eager, batch_gradients


def reshape(recipe: Recipe, reference: Reference, tm: Any, rank: int, world: int) -> ScenarioRecord:
    eager = Eager.beside(recipe, reference, tm)
    batch = Batch.draw(recipe.fixture.second_input, recipe, eager.module, AFTER_TRAINING, world)
    try:
        out = tm(batch.inputs[rank])
        loss(out, batch.cotangents[rank]).backward()
    except Exception as exc:  # Thunder's own call: its refusal is a finding, not the end of the cell
        return ScenarioRecord("reshape", error=f"{type(exc).__name__}: {exc}")
    traces = final_traces(tm)
    grads = reference.gather(tm, grads=True)
    tm.zero_grad(set_to_none=True)
    outs, expected = batch_gradients(eager.module, batch)
    golden_outs, golden = (
        batch_gradients(eager.golden, batch, float32=True) if eager.golden is not None else (None, None)
    )
    local = rank_gradients(eager.module, batch.inputs, batch.cotangents) if eager.golden is not None else None
    return ScenarioRecord(
        "reshape",
        output=out.detach().cpu(),
        reference_output=outs[rank],
        golden_output=None if golden_outs is None else golden_outs[rank],
        grads=grads,
        reference_grads=expected,
        golden_grads=golden,
        local=local,
        traces=traces,
    )

"""``reshape``: one forward and backward of the Thunder module on inputs of a second shape
(the model fixture's ``second_input``: another batch size or sequence length). Thunder
caches a computation per input shape, so this compiles a second one, and the FSDP transform
must shard, gather and reduce in it exactly as in the first: its output and gradients
against eager's, its collectives counted like the training's."""

from __future__ import annotations

from typing import Any

from conformance.checks.record import ScenarioRecord
from conformance.checks.traces import final_traces
from conformance.rank.build import EagerModel, Recipe
from conformance.rank.clock import thunder_call
from conformance.rank.eager import loss, rank_gradients
from conformance.rank.process_group import calls_for, counting
from conformance.rank.scenarios.beside import AFTER_TRAINING, Batch, Eager, batch_gradients


def reshape(recipe: Recipe, eager_model: EagerModel, tm: Any, optimizer: Any, rank: int, world: int) -> ScenarioRecord:
    eager = Eager.beside(recipe, eager_model, tm)
    batch = Batch.draw(recipe.fixture.second_input, recipe, eager.module, AFTER_TRAINING, world)
    calls = calls_for(recipe.composition)
    try:
        with thunder_call():
            with counting(calls, "forward"):
                out = tm(batch.inputs[rank])
            with counting(calls, "backward"):
                loss(out, batch.cotangents[rank]).backward()
    except Exception as exc:  # Thunder's own call: its refusal is a finding, not the end of the cell
        return ScenarioRecord("reshape", error=f"{type(exc).__name__}: {exc}")
    # under PyTorch's parallelism the collectives are counted at the process group instead
    traces = final_traces(tm) if calls is None else None
    grads = eager_model.gather(tm, grads=True)
    tm.zero_grad(set_to_none=True)
    passed = batch_gradients(eager.module, batch)
    twin = batch_gradients(eager.twin, batch, float32=True) if eager.twin is not None else None
    local = rank_gradients(eager.module, batch.inputs, batch.cotangents) if eager.twin is not None else None
    return ScenarioRecord(
        "reshape",
        output=out.detach().cpu(),
        eager_output=passed.outputs[rank],
        twin_output=None if twin is None else twin.outputs[rank],
        grads=grads,
        eager_grads=passed.grads,
        twin_grads=None if twin is None else twin.grads,
        local=local,
        traces=traces,
        issued=calls,
    )

"""``infer``: one forward of the Thunder module under ``torch.no_grad`` on a fresh input of
this rank. Under no_grad Thunder compiles another computation (a forward only): it must
still gather every sharded parameter, reduce nothing, and hand back a result that needs no
gradient."""

from __future__ import annotations

from typing import Any

import torch

from conformance.checks.record import ScenarioRecord
from conformance.checks.traces import FinalTraces
from conformance.rank.build import EagerModel, Recipe
from conformance.rank.clock import thunder_call
from conformance.rank.eager import float32_input
from conformance.rank.process_group import calls_for, counting
from conformance.rank.scenarios.beside import AFTER_TRAINING, Eager
from conformance.rank.train import generator


def infer(
    recipe: Recipe, eager_model: EagerModel, tm: Any, optimizer: Any, rank: int, world: int
) -> ScenarioRecord:
    """Run and record the no_grad forward, and the trace Thunder compiled for it (read right
    after the call: ``thunder.last_traces`` names the last computation that ran)."""
    import thunder

    eager = Eager.beside(recipe, eager_model, tm)
    x = recipe.fixture.make_input(generator(AFTER_TRAINING, rank), recipe.dtype).to(recipe.device)
    calls = calls_for(recipe.composition)
    try:
        with torch.no_grad(), thunder_call(), counting(calls, "forward"):
            out = tm(x)
    except Exception as exc:  # Thunder's own call: its refusal is a finding, not the end of the cell
        return ScenarioRecord("infer", error=f"{type(exc).__name__}: {exc}")
    # under PyTorch's parallelism the collectives are counted at the process group instead
    trace = thunder.last_traces(tm)[-1] if calls is None else None
    with torch.no_grad():
        expected = eager.module(x)
        twin = eager.twin(float32_input(x)) if eager.twin is not None else None
    return ScenarioRecord(
        "infer",
        output=out.detach().cpu(),
        requires_grad=bool(out.requires_grad),
        eager_output=expected.detach().cpu(),
        twin_output=None if twin is None else twin.detach().cpu(),
        traces=None if trace is None else FinalTraces(trace, None),
        issued=calls,
    )

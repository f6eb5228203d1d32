"""``accumulate``: gradient accumulation over ``MICRO_STEPS`` micro-batches, the gradient
sync skipped on all but the last, the way Thunder documents it (``ThunderModule.no_sync``:
the skipped micro-steps' backward inside it, which syncs what they accumulated on exit, then
one ordinary forward and backward). The accumulated gradients must equal the sum of eager's
gradients of each micro-batch (each the ranks' averaged loss), and the backward Thunder
compiles for the skipped micro-steps must reduce nothing: that is the point of skipping.

Where the gradients are wrong, the record carries what three recognisable mistakes would
give (the last micro-step's gradients alone, the skipped ones' alone, the skipped ones summed
over the ranks rather than averaged), so that the finding names the mistake Thunder made.
"""

from __future__ import annotations

import contextlib
from typing import Any

from conformance.checks.record import Issued, ScenarioRecord
from conformance.checks.traces import final_traces
from conformance.rank.build import EagerModel, Recipe
from conformance.rank.clock import thunder_call
from conformance.rank.eager import loss, rank_gradients
from conformance.rank.process_group import calls_for, counting
from conformance.rank.scenarios.beside import AFTER_TRAINING, Batch, Eager, batch_gradients, combined, summed, weighted
from conformance.rank.waits import awaited
from fixtures.options import MICRO_STEPS


def accumulate(
    recipe: Recipe, eager_model: EagerModel, tm: Any, optimizer: Any, rank: int, world: int
) -> ScenarioRecord:
    eager = Eager.beside(recipe, eager_model, tm)
    batches = [
        Batch.draw(recipe.fixture.make_input, recipe, eager.module, AFTER_TRAINING + i, world)
        for i in range(MICRO_STEPS)
    ]
    # under PyTorch's parallelism the collectives are counted at the process group, every
    # micro-step's in its phase (the skipped ones' and the last's together)
    calls = calls_for(recipe.composition)
    # leaving no_sync, Thunder's own transforms sync what was skipped through torch.distributed
    unwaited: list[str] = []
    tracking = awaited(unwaited, "leaving no_sync") if calls is None else contextlib.nullcontext()
    try:
        with tracking, tm.no_sync():
            for batch in batches[:-1]:
                with thunder_call():
                    _step(tm, batch, rank, calls)
            traces = final_traces(tm)  # the computation Thunder compiled for a skipped sync
        with thunder_call():
            _step(tm, batches[-1], rank, calls)
    except Exception as exc:  # Thunder's own call: its refusal is a finding, not the end of the cell
        return ScenarioRecord("accumulate", error=f"{type(exc).__name__}: {exc}")
    grads = eager_model.gather(tm, grads=True)
    tm.zero_grad(set_to_none=True)
    per_step = [batch_gradients(eager.module, b).grads for b in batches]
    twin = [batch_gradients(eager.twin, b, float32=True).grads for b in batches] if eager.twin is not None else None
    # below float32, each micro-step's gradients as the ranks compute them (numerics.tolerances.Local)
    local = [rank_gradients(eager.module, b.inputs, b.cotangents) for b in batches] if twin is not None else None
    skipped = len(batches) - 1
    # each recognisable mistake as the weight it gives each micro-step's gradients
    mistakes = {
        "the last micro-step's alone": [0.0] * skipped + [1.0],
        "the skipped micro-steps' alone": [1.0] * skipped + [0.0],
        # the sync on leaving no_sync summing the ranks' stashed gradients, not averaging them
        "the skipped micro-steps' summed over the ranks, not averaged": [float(world)] * skipped + [1.0],
    }
    return ScenarioRecord(
        "accumulate",
        grads=grads,
        eager_grads=summed(per_step),
        twin_grads=None if twin is None else summed(twin),
        local=None if local is None else combined(local),
        alternatives={
            name: (weighted(per_step, w), None if twin is None else weighted(twin, w)) for name, w in mistakes.items()
        },
        alternatives_local={} if local is None else {name: combined(local, w) for name, w in mistakes.items()},
        traces=None if calls is not None else traces,
        issued=calls,
        unwaited=unwaited,
    )


def _step(tm: Any, batch: Batch, rank: int, calls: list[Issued] | None) -> None:
    """One micro-step's forward and backward, each counted where ``calls`` is a list."""
    with counting(calls, "forward"):
        out = tm(batch.inputs[rank])
    with counting(calls, "backward"):
        loss(out, batch.cotangents[rank]).backward()

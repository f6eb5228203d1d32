"""Inference after training: one forward of the Thunder module under ``torch.no_grad`` on a
fresh input of this rank, beside eager PyTorch holding the Thunder module's own weights (so
the comparison does not depend on how far training let the two drift apart) and, below
float32, a float32 twin of that eager model for the tolerances.

Under no_grad Thunder compiles another computation (a forward only): it must still gather
every sharded parameter, reduce nothing, and hand back a result that needs no gradient.
"""

from __future__ import annotations

import copy

import torch

from conformance.checks.record import InferenceRecord
from conformance.rank.build import Recipe, Reference
from conformance.rank.gather import gather
from conformance.rank.train import STEPS, float32_input, generator
from fixtures.optimizers import OPTIMIZERS

# the input of the step after the last training step: one neither model has seen
INFERENCE_STEP = STEPS * len(OPTIMIZERS)


def infer(recipe: Recipe, reference: Reference, tm: object, rank: int) -> InferenceRecord:
    """Run and record the no_grad forward, and the trace Thunder compiled for it (read right
    after the call: ``thunder.last_traces`` names the last computation that ran)."""
    import thunder

    x = recipe.fixture.make_input(generator(INFERENCE_STEP, rank), recipe.dtype).to(recipe.device)
    try:
        with torch.no_grad():
            out = tm(x)
    except Exception as exc:  # Thunder's own call: its refusal is a finding, not the end of the cell
        return InferenceRecord(error=f"{type(exc).__name__}: {exc}")
    trace = thunder.last_traces(tm)[-1]
    eager = _holding(reference.module, gather(tm, reference.shapes))
    golden = copy.deepcopy(eager).float() if recipe.dtype != torch.float32 else None  # .float() is in place
    with torch.no_grad():
        expected = eager(x)
        golden_out = golden(float32_input(x)) if golden is not None else None
    return InferenceRecord(
        output=out.detach().cpu(),
        requires_grad=bool(out.requires_grad),
        reference_output=expected.detach().cpu(),
        golden_output=None if golden_out is None else golden_out.detach().cpu(),
        trace=trace,
    )


def _holding(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A copy of the eager ``module`` whose parameters hold ``weights`` (one name per tied
    group: writing it writes every name of the tie)."""
    twin = copy.deepcopy(module)
    with torch.no_grad():
        for name, value in weights.items():
            p = twin.get_parameter(name)
            p.copy_(value.to(p.device, p.dtype))
    return twin

"""Numerics' judgement of what a cell's scenario did after training (conformance/rank/scenarios/)."""

from __future__ import annotations

import torch

from conformance.checks.findings import Findings
from conformance.checks.numerics.tolerances import Local, compare, named_output
from conformance.checks.record import ScenarioRecord
from fixtures.options import MICRO_STEPS

# How a scenario's findings name what it compared (conformance/rank/scenarios/).
PHRASES = {
    "infer": "under no_grad",
    "accumulate": f"accumulated over {MICRO_STEPS} micro-steps",
    "reshape": "at the second input shape",
    "resume": "after resuming from a checkpoint",  # judged by the state_dict area: it records no output here
}


def judge_scenario(found: Findings, record: ScenarioRecord, dtype: torch.dtype, world: int) -> None:
    """What the cell's scenario did after training, against eager PyTorch holding the Thunder
    module's own weights: its output and gradients with the same tolerances as a training
    step's (below float32, from that eager model's float32 twin); under no_grad, a result
    that needs no gradient. Gradients that equal one of the record's recognisable mistakes
    fail once, naming it."""
    phrase = PHRASES[record.scenario]
    first = "output" if record.scenario != "accumulate" else "gradients"
    if record.error is not None:
        # the first line names the kind of refusal (what an xfails entry pins), the next what Thunder said
        kind = record.error.split(":", 1)[0]
        message = f"{first} {phrase}: Thunder raised {kind}\n{record.error}"
        found.fail("numerics.scenario_raised", message, quantity=first, scenario=record.scenario, raised=kind)
        return
    if record.requires_grad is not None:
        with found.expect("numerics.requires_grad", f"output {phrase} needs no gradient", scenario=record.scenario):
            assert not record.requires_grad, "it requires grad: Thunder recorded the computation for a backward"
    if record.output is not None and record.eager_output is not None:
        actual, expected = {"output": record.output}, {"output": record.eager_output}
        fields = {"quantity": "output", "scenario": record.scenario}
        twin = named_output(record.twin_output)
        compare(found, f"output {phrase}", actual, expected, twin, dtype, fields=fields)
    if record.grads is None or record.eager_grads is None:
        return
    what = f"gradients {phrase}"
    scratch = Findings()
    # the twin holds the same weights; each micro-step accumulated adds one more addition
    additions = world - 1 + (MICRO_STEPS - 1 if record.scenario == "accumulate" else 0)
    local = Local.of(record.local, record.twin_grads, additions, dtype)
    fields = {"quantity": "gradients", "scenario": record.scenario}
    ok = compare(scratch, what, record.grads, record.eager_grads, record.twin_grads, dtype, local=local, fields=fields)
    found.metrics.update(scratch.metrics)
    if ok:
        return
    for name, (eager_model, twin) in record.alternatives.items():
        local = Local.of(record.alternatives_local.get(name), twin, additions, dtype)
        if compare(Findings(), what, record.grads, eager_model, twin, dtype, local=local):
            found.fail("numerics.scenario_equals", f"{what}: equal {name}", scenario=record.scenario, equals=name)
            return
    found.found += scratch.found

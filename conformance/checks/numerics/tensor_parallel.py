"""Numerics of a tensor-parallel cell: every rank's whole output, and after each training step
the full gradients and parameters, against eager's whole model on the same batch (independent:
one process, no parallelism) and against eager tensor parallelism, the same plan without Thunder
(the reference that shares the plan's reduction order). Float32 only (axes.valid): FLOAT32's
tolerances, derived for sharded reductions that sum in another order than eager's.
"""

from __future__ import annotations

from conformance.checks.findings import Findings
from conformance.checks.numerics.tolerances import FLOAT32, TENSOR
from conformance.checks.record import TensorParallelRecord

# the references, by how a failure names them
REFERENCES = (("eager", "eager's whole model"), ("eager_tp", "eager tensor parallelism"))


def check(run: TensorParallelRecord) -> Findings:
    found = Findings()
    for k, step in enumerate(run.steps):
        for attr, who in REFERENCES:
            fields = {"step": k, "reference": attr}
            reference = {"output": getattr(step, attr)}
            mine = {"output": step.output}
            found.close(TENSOR, f"step {k} output against {who}", mine, reference, fields=fields, **FLOAT32)
            if not run.trained:
                continue
            for kind, held in (("grads", step.grads), ("after", step.after)):
                theirs = getattr(step, f"{attr}_{kind}") or {}
                what = f"step {k} {'gradients' if kind == 'grads' else 'parameters after the step'} against {who}"
                found.close(TENSOR, what, held or {}, theirs, fields=fields, **FLOAT32)
    return found

"""Numerics: the Thunder module trains exactly like eager PyTorch on the same weights.

Compared on every rank: outputs and full gradients of the first step, and full parameters
after the SGD steps and again after the AdamW steps that follow them.

Float32 is held to fixed tolerances. Below float32, eager PyTorch is itself only an
approximation, so each tensor's tolerance is derived from eager's own error: Thunder may be
at most ``EAGER_ERROR_FACTOR`` times as far from a float32 twin (trained in lockstep from the
same weights) as eager is, plus the dtype's floor.
"""

from __future__ import annotations

import torch

from conformance.checks.area import Area
from conformance.checks.findings import Findings
from conformance.checks.record import CellRecord
from conformance.checks.storages import tie_groups

# assert_close tolerances per dtype. Sharded reductions sum in another order than eager, and
# the optimizer steps compound it, so they sit a little above assert_close's defaults.
TOLERANCES = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-5},
}
EAGER_ERROR_FACTOR = 2.0


def check(run: CellRecord) -> Findings:
    found = Findings()
    tol = TOLERANCES[run.dtype]
    first = run.first_step
    out, ref_out = {"output": first.output}, {"output": first.reference_output}
    golden_out = None if first.golden_output is None else {"output": first.golden_output}
    found.close("output", out, ref_out, eager_error(ref_out, golden_out), **tol)
    found.close(
        "gradients", first.grads, first.reference_grads, eager_error(first.reference_grads, first.golden_grads), **tol
    )
    for optimizer, params in run.after.items():
        per_name = eager_error(params.reference, params.golden)
        found.close(f"parameters after {optimizer}", params.thunder, params.reference, per_name, **tol)

    # Tied names must resolve to one parameter: one shard, one gradient, one update.
    for group in tie_groups(run.reference):
        with found.expect(f"tied parameters {group}"):
            distinct = {id(run.thunder_module.get_parameter(n)) for n in group}
            assert len(distinct) == 1, f"the Thunder module holds {len(distinct)} distinct tensors for one tied weight"
    return found


def eager_error(
    eager: dict[str, torch.Tensor], golden: dict[str, torch.Tensor] | None
) -> dict[str, dict[str, float]] | None:
    """Per-name atol: EAGER_ERROR_FACTOR x eager's own distance from the float32 twin."""
    if golden is None:
        return None
    return {
        n: {"atol": EAGER_ERROR_FACTOR * (e.double() - golden[n].double()).abs().max().item() + 1e-5}
        for n, e in eager.items()
        if n in golden
    }


AREA = Area("numerics", check)

"""Numerics: the Thunder module trains exactly like eager PyTorch on the same weights.

Compared on every rank: outputs and full gradients of the first step, and full parameters
after every step has been applied. For real init, the gathered shards must also rebuild the
initial weights bit for bit (sharding itself moves no values).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from conformance.findings import Findings

if TYPE_CHECKING:
    from conformance.execute import CellRun

# assert_close tolerances per dtype. Sharded reductions sum in another order than eager, and
# three optimizer steps compound it, so they sit a little above assert_close's defaults.
TOLERANCES = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}


def check(run: CellRun) -> Findings:
    found = Findings()
    tol = TOLERANCES[run.dtype]
    if not run.on_meta:
        found.close("initial parameters", run.initial, run.reference_initial, rtol=0.0, atol=0.0)
    first = run.steps[0]
    found.close("output", {"output": first.output}, {"output": first.reference_output}, **tol)
    found.close("gradients", first.grads, first.reference_grads, **tol)
    found.close(f"parameters after {len(run.steps)} steps", run.final, run.reference_final, **tol)

    # Tied names must resolve to one parameter: one shard, one gradient, one update.
    for group in _tie_groups(run.reference):
        with found.expect(f"tied parameters {group}"):
            held = {id(run.thunder_module.get_parameter(n)) for n in group}
            assert len(held) == 1, f"the Thunder module holds {len(held)} distinct tensors for one tied weight"
    return found


def _tie_groups(module: torch.nn.Module) -> list[list[str]]:
    groups: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [names for names in groups.values() if len(names) > 1]

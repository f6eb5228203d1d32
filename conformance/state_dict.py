"""State dicts: ``original_state_dict()`` after training holds exactly the weights the shards
hold (gathered by the kit itself) under the eager model's keys, and
``load_original_state_dict()`` puts exactly the loaded weights back into the shards.

Thunder leaves tied duplicates out of ``original_state_dict()``: every other entry must be
there, and no entry may be one the eager model does not have. (How close those weights are
to eager training is the numerics area's business.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conformance.findings import Findings

if TYPE_CHECKING:
    from conformance.execute import CellRun


def check(run: CellRun) -> Findings:
    found = Findings()
    reference = run.reference
    duplicates = {n for n, _ in reference.named_parameters(remove_duplicate=False)} - {
        n for n, _ in reference.named_parameters()
    }
    expected = {k: v for k, v in run.reference_state_dict.items() if k not in duplicates}
    with found.expect("original_state_dict keys"):
        missing = sorted(set(expected) - set(run.original_state_dict))
        extra = sorted(set(run.original_state_dict) - set(run.reference_state_dict))
        assert not missing and not extra, f"missing {missing}, unexpected {extra}"
    gathered = {**run.buffers, **run.after[list(run.after)[-1]][0]}  # the shards, gathered by the kit
    held = {k: v for k, v in gathered.items() if k in expected}
    found.close("original_state_dict after training", run.original_state_dict, held, rtol=0.0, atol=0.0)
    found.close("load_original_state_dict round trip", run.reloaded, run.loaded, rtol=0.0, atol=0.0)
    return found

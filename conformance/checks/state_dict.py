"""State dicts: ``original_state_dict()`` after training holds exactly the weights the shards
hold (gathered by the kit itself) under the eager model's keys, and
``load_original_state_dict()`` puts exactly the loaded weights back into the shards.

Thunder leaves tied duplicates out of ``original_state_dict()``: every other entry must be
there, and no entry may be one the eager model does not have. (How close those weights are
to eager training is the numerics area's business.)
"""

from __future__ import annotations

from conformance.checks.area import Area
from conformance.checks.findings import Findings
from conformance.checks.record import CellRecord
from conformance.checks.storages import tied_duplicates


def check(run: CellRecord) -> Findings:
    found = Findings()
    record = run.state_dict
    duplicates = tied_duplicates(run.reference)
    expected = {k: v for k, v in record.reference.items() if k not in duplicates}
    with found.expect("original_state_dict keys"):
        missing = sorted(set(expected) - set(record.original))
        extra = sorted(set(record.original) - set(record.reference))
        assert not missing and not extra, f"missing {missing}, unexpected {extra}"
    gathered = {**record.buffers, **run.steps[-1].after.thunder}  # the shards gathered by the kit
    on_shards = {k: v for k, v in gathered.items() if k in expected}
    # a key missing or unexpected is the keys' finding above; the values are compared where both have one
    both = set(record.original) & set(on_shards)
    found.close(
        "original_state_dict after training",
        {k: v for k, v in record.original.items() if k in both},
        {k: v for k, v in on_shards.items() if k in both},
        rtol=0.0,
        atol=0.0,
    )
    found.close("load_original_state_dict round trip", record.reloaded, record.loaded, rtol=0.0, atol=0.0)
    return found


AREA = Area("state_dict", check)

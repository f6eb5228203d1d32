"""State dicts: ``original_state_dict()`` after training holds exactly the weights the shards
hold (gathered by the kit itself) under the eager model's keys, and
``load_original_state_dict()`` puts exactly the loaded weights back into the shards.

Thunder leaves tied duplicates out of ``original_state_dict()``: every other entry must be
there, and no entry may be one the eager model does not have. (How close those weights are
to eager training is the numerics area's business.)

Under the ``resume`` scenario, each checkpoint Thunder takes (full, sharded) must hold what
the kit gathers, and a fresh composition it is loaded into must resume bit for bit where the
uninterrupted run goes (conformance/rank/scenarios/resume.py).
"""

from __future__ import annotations

from conformance.checks.area import Area
from conformance.checks.findings import Findings
from conformance.checks.record import CellRecord, Resumed
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
    # the shards gathered by the kit when original_state_dict() was taken
    gathered = {**record.buffers, **(record.gathered or run.steps[-1].after.thunder)}
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
    if run.scenario is not None:
        for resumed in run.scenario.resumed:
            judge_resumed(found, resumed, set(record.reference))
    return found


def judge_resumed(found: Findings, resumed: Resumed, eager_keys: set[str]) -> None:
    """One checkpoint round trip of the ``resume`` scenario: the checkpoint holds what the kit
    gathered, under eager's names (every one but a tie's duplicates, none eager lacks), and
    the module it was loaded into is, at every moment after, bit for bit the uninterrupted
    one. Thunder's failure to take, save or load it is a finding naming the call."""
    what = f"{resumed.kind} checkpoint"
    if resumed.api_error is not None:
        kind = resumed.api_error.split(":", 1)[0]
        found.failures.append(
            f"{what}: thunder.distributed.checkpoint.get_model_state_dict raised {kind}\n{resumed.api_error}"
        )
    with found.expect(f"{what} keys"):
        missing = sorted(set(resumed.truth) - set(resumed.taken))
        extra = sorted(set(resumed.taken) - eager_keys)
        assert not missing and not extra, f"missing {missing}, unexpected {extra}"
    both = set(resumed.truth) & set(resumed.taken)
    found.close(
        f"{what} after training",
        {k: v for k, v in resumed.taken.items() if k in both},
        {k: v for k, v in resumed.truth.items() if k in both},
        rtol=0.0,
        atol=0.0,
    )
    if resumed.error is not None:
        # the first line names the kind of refusal (what an xfails entry pins), the next what Thunder said
        found.failures.append(f"{what} resumed: Thunder raised {resumed.error.split(':', 1)[0]}\n{resumed.error}")
    for moment in resumed.compared:
        found.close(f"{what} resumed: {moment.what}", moment.resumed, moment.uninterrupted, rtol=0.0, atol=0.0)


AREA = Area("state_dict", check)

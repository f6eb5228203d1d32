"""State dicts: ``original_state_dict()`` after training holds exactly the weights the shards
hold (gathered by the kit itself) under the eager model's keys, and
``load_original_state_dict()`` puts exactly the loaded weights back into the shards, and
the loaded persistent buffers into every rank's module.

Thunder leaves tied duplicates out of ``original_state_dict()``: every other entry must be
there, and no entry may be one the eager model does not have. (How close those weights are
to eager training is the numerics area's business.)

Under PyTorch's parallelism the same, through torch.distributed.checkpoint's full state dict
(``get_model_state_dict``, ``set_model_state_dict``: ``StateDictRecord.api``); what either
raises is a finding.

Under the ``resume`` scenario, each checkpoint Thunder takes (full, sharded) must hold what
the kit gathers, and a fresh composition it is loaded into must resume bit for bit where the
uninterrupted run goes (conformance/rank/scenarios/resume.py). The full checkpoint taken with
``rank0_only=True`` must be whole on rank 0 and empty elsewhere, and loaded that way it must
land on rank 0 and leave every other rank's tensors as they were or give them rank 0's
(conformance/rank/scenarios/rank0_only.py).
"""

from __future__ import annotations

from conformance.checks.area import Area
from conformance.checks.checkpoint_record import THUNDER_TAKEN_BY, RankZeroOnly, Resumed
from conformance.checks.findings import Findings, identical, raised_kind
from conformance.checks.record import CellRecord, Tensors
from conformance.checks.storages import tied_duplicates

TENSOR = "state_dict.tensor"  # a tensor of a state dict, or of a module loaded from one, off from the truth
RAISED = "state_dict.raised"  # Thunder raised taking, resuming from or loading a checkpoint
EXACT = {"rtol": 0.0, "atol": 0.0}


def check(run: CellRecord) -> Findings:
    found = Findings()
    record = run.state_dict
    take, load = record.api
    duplicates = tied_duplicates(run.eager_model)
    expected = {k: v for k, v in record.eager_model.items() if k not in duplicates}
    # the shards gathered by the kit when the state dict was taken
    gathered = {**record.buffers, **(record.gathered or run.steps[-1].after.thunder)}
    on_shards = {k: v for k, v in gathered.items() if k in expected}
    if record.taken_error is not None:
        _raised(found, take, "taken", record.taken_error)
    else:
        _entries(found, take, record.original, on_shards, set(expected), set(record.eager_model))
    if record.loaded_error is not None:
        _raised(found, load, "round trip", record.loaded_error)
        return _judge_scenario(found, run)
    round_trip = {"dict": load, "stage": "round trip"}
    found.close(TENSOR, f"{load} round trip", record.reloaded, record.loaded, fields=round_trip, **EXACT)
    # the persistent buffers loaded with them: known values (conformance/rank/entry.py), every rank
    found.close(
        TENSOR,
        f"{load} round trip: buffers",
        record.reloaded_buffers,
        record.loaded_buffers,
        fields={**round_trip, "stage": "round trip: buffers"},
        **EXACT,
    )
    return _judge_scenario(found, run)


def _raised(found: Findings, call: str, stage: str, error: str) -> None:
    """``call`` raised: the first word of ``error`` is its kind (what an xfails entry pins)."""
    kind = raised_kind(error)
    found.fail(RAISED, f"{call} ({stage}) raised {error}", dict=call, stage=stage, call=call, raised=kind)


def _judge_scenario(found: Findings, run: CellRecord) -> Findings:
    """The checkpoints the cell's scenario took and loaded (``resume``, ``rank0_only``)."""
    record = run.state_dict
    if run.scenario is not None:
        for resumed in run.scenario.resumed:
            judge_resumed(found, resumed, set(record.eager_model))
        if run.scenario.rank0_only is not None:
            judge_rank0_only(found, run.scenario.rank0_only, set(record.eager_model))
    return found


def _entries(found: Findings, what: str, got: Tensors, truth: Tensors, required: set[str], allowed: set[str]) -> None:
    """A state dict Thunder gave against what the kit gathered: every ``required`` key there
    and none outside ``allowed`` (``what keys``), and, exactly, the value of every key both
    hold (``what after training``: a key missing or unexpected is the keys' finding)."""
    missing = sorted(required - set(got))
    extra = sorted(set(got) - allowed)
    with found.expect("state_dict.keys", f"{what} keys", dict=what, missing=missing, unexpected=extra):
        assert not missing and not extra, f"missing {missing}, unexpected {extra}"
    both = set(got) & set(truth)
    found.close(
        TENSOR,
        f"{what} after training",
        {k: v for k, v in got.items() if k in both},
        {k: v for k, v in truth.items() if k in both},
        fields={"dict": what, "stage": "after training"},
        **EXACT,
    )


def _taken_raised(found: Findings, what: str, call: str, error: str, origin: str | None) -> None:
    """``call`` raised taking the checkpoint ``what``: its kind and whose code raised it (the
    package of the innermost frame) are what an xfails entry pins, so that a raise of
    Thunder's own code is not taken for one torch makes beneath it."""
    kind = error.split(":", 1)[0]
    origin = origin or "unknown"
    message = f"{what}: {call} raised {kind}\n{error} (raised by {origin}'s code)"
    found.fail(RAISED, message, dict=what, stage="taken", call=call, raised=kind, origin=origin)


def judge_resumed(found: Findings, resumed: Resumed, eager_keys: set[str]) -> None:
    """One checkpoint round trip of the ``resume`` scenario: the checkpoint holds what the kit
    gathered, under eager's names (every one but a tie's duplicates, none eager lacks), and
    the module it was loaded into is, at every moment after, bit for bit the uninterrupted
    one. Thunder's failure to take, save or load it is a finding naming the call."""
    what = f"{resumed.kind} checkpoint"
    if resumed.api_error is not None:
        _taken_raised(found, what, resumed.taken_by, resumed.api_error, resumed.api_origin)
    _entries(found, what, resumed.taken, resumed.truth, set(resumed.truth), eager_keys)
    if resumed.error is not None:
        # the first line names the kind of refusal (what an xfails entry pins), the next what Thunder said
        kind = resumed.error.split(":", 1)[0]
        found.fail(
            RAISED, f"{what} resumed: Thunder raised {kind}\n{resumed.error}", dict=what, stage="resumed", raised=kind
        )
    for moment in resumed.compared:
        stage = f"resumed: {moment.what}"
        found.close(
            TENSOR,
            f"{what} {stage}",
            moment.resumed,
            moment.uninterrupted,
            fields={"dict": what, "stage": stage},
            **EXACT,
        )


def judge_rank0_only(found: Findings, record: RankZeroOnly, eager_keys: set[str]) -> None:
    """The full checkpoint with ``rank0_only=True``: taken, rank 0 holds all of it (as
    ``_entries`` asks of any full checkpoint) and another rank nothing; loaded, rank 0's
    module holds it, and another rank's, given nothing, either kept its own tensors or got
    rank 0's (a Thunder that broadcasts), never some mix."""
    what = "full checkpoint with rank0_only"
    if record.take_error is not None:
        _taken_raised(found, what, THUNDER_TAKEN_BY, record.take_error, record.take_origin)
    if record.taken is not None:
        if record.rank == 0:
            _entries(found, what, record.taken, record.truth, set(record.truth), eager_keys)
        else:
            with found.expect(
                "state_dict.rank_takes_something", f"{what}: rank {record.rank} takes nothing", dict=what
            ):
                assert not record.taken, f"it took {len(record.taken)} tensors: {sorted(record.taken)[:4]}"
    if record.error is not None:
        kind = record.error.split(":", 1)[0]
        found.fail(
            RAISED, f"{what} loaded: Thunder raised {kind}\n{record.error}", dict=what, stage="loaded", raised=kind
        )
        return
    kept = record.rank != 0 and record.loaded.keys() == record.untouched.keys()
    if kept and all(identical(t, record.untouched[n]) for n, t in record.loaded.items()):
        return
    whose = "rank 0's" if record.rank == 0 else f"rank {record.rank}'s, given nothing, neither kept nor"
    found.close(
        TENSOR,
        f"{what} loaded: {whose} the checkpoint",
        record.loaded,
        record.checkpoint,
        fields={"dict": what, "stage": "loaded"},
        **EXACT,
    )


AREA = Area("state_dict", check, parallelisms=frozenset({"thunder", "torch"}))

"""Collectives: what Thunder put into its final forward and backward execution traces,
counted through bound symbols, against what the model's structure implies. Under PyTorch's
parallelism, where FSDP2 or DDP own the collectives, what each step issued at the process
group, against FSDP2's arithmetic (checks/fsdp2.py) or DDP's buckets (checks/torch_ddp.py).
Under tensor parallelism, what each step issued at the process group, against Megatron's
arithmetic over the plan's Linears as eager's whole model called them (checks/megatron.py).

Expectations come from the eager model: one all-gather per bucket in the forward,
one reduce-scatter per bucket of trainable storages in the backward, a re-gather of every
bucket in the backward only under ZERO3, and no all-reduce anywhere. Without bucketing a
bucket is one distinct parameter storage (a tied weight is one storage, however many names
it has); LAYER puts the storages of one module together, BLOCK those under one numbered
child of a module list (a transformer block), each other storage alone. Under DDP (every
rank holds the whole model): nothing gathered, and in the backward one all-reduce per
bucket of gradients DDP packs (``ddp_buckets``: one per trainable storage without bucketing),
nothing else.

A count that differs from the expected one but equals what the same cell would expect under a
recognised alternative says so, so that an xfails entry can pin which alternative Thunder
did: `` (the count without bucketing)`` (bucketing NONE) or `` (the count under ZERO2)``
(no backward re-gather). Where both alternatives give the count, the one listed first in
``ALTERNATIVES`` (without bucketing) is named.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Iterable
from typing import Any

import torch

from conformance.checks import fsdp2, megatron, torch_ddp
from conformance.checks.area import Across, Area
from conformance.checks.buckets import buckets, ddp_buckets
from conformance.checks.findings import Failure, Findings
from conformance.checks.record import CellRecord, Issued, SimulatedRecord, TensorParallelRecord
from conformance.checks.reductions import REDUCING, bytes_derived, judge_backward
from conformance.checks.storages import distinct_storages, padded_bytes
from conformance.checks.traces import KINDS, MISSING, collective_symbols, group_ranks, issued
from fixtures.compositions import COMPOSITIONS, FSDP_WIDTH, replica_ranks, shard_ranks
from fixtures.options import MICRO_STEPS, MIXED
from transforms.policies import proxy_bytes


def expected_counts(
    module: torch.nn.Module, sharding: str, bucketing: str, replicated: bool = False, hybrid: bool = False
) -> dict[str, dict[str, int]]:
    """Per phase and kind, how many collectives a training step's traces hold. ``hybrid``:
    FSDP's within a row of the mesh, then each gradient shard a row reduced is averaged across
    the rows, one all-reduce per reduce-scatter (the plugin's DDP transform over the shards;
    on the pin it buckets none of them: calibrated there, see docs/checks/collectives.md)."""
    if replicated:  # DDP: nothing gathered, one all-reduce per bucket of gradients
        return {
            "forward": {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0},
            "backward": {"all_gather": 0, "reduce_scatter": 0, "all_reduce": len(ddp_buckets(module, bucketing))},
        }
    trainable = len(buckets(module, bucketing, trainable_only=True))
    storages = len(buckets(module, bucketing))
    return {
        "forward": {"all_gather": storages, "reduce_scatter": 0, "all_reduce": 0},
        "backward": {
            "all_gather": storages if sharding == "zero3" else 0,
            "reduce_scatter": trainable,
            "all_reduce": trainable if hybrid else 0,
        },
    }


def judge_hybrid(
    found: Findings, symbols: dict[str, dict[str, list[Any]]], module: torch.nn.Module, rank: int, world: int
) -> None:
    """Hybrid sharding's collectives by group: FSDP's all-gathers and reduce-scatters within
    this rank's row of the mesh, DDP's all-reduces across its column (``hybrid_mesh``'s
    layout, from the rank and the world size), and the all-reduced bytes one shard of every
    trainable storage (what the row's reduce-scatter left this rank)."""
    row = shard_ranks(rank, world)
    column = replica_ranks(rank, world)
    wanted = {"all_gather": ("row", row), "reduce_scatter": ("row", row), "all_reduce": ("column", column)}
    for phase, by_kind in symbols.items():
        for kind, bsyms in by_kind.items():
            where, ranks = wanted[kind]
            groups = sorted({group_ranks(b) or () for b in bsyms})
            wrong = [list(g) for g in groups if g != ranks]
            label = f"{phase} {kind} groups"
            found.metrics[label] = [list(g) for g in groups]
            with found.expect("collectives.group", label, phase=phase, kind=kind, wrong=wrong):
                assert not wrong, f"issued on ranks {wrong}, expected this rank's {where} of the mesh {list(ranks)}"
    if "backward" in symbols:
        shards = sum(padded_bytes(p, FSDP_WIDTH) for p in distinct_storages(module, trainable_only=True).values())
        want = shards // FSDP_WIDTH
        got = sum(proxy_bytes(b.flat_proxy_args[0]) for b in symbols["backward"]["all_reduce"] if b.flat_proxy_args)
        found.equal("collectives.bytes", "backward all-reduced bytes", got, want, phase="backward", kind="all_reduce")


# (key, annotation, (sharding, bucketing) -> the alternative's (sharding, bucketing)), in the
# order they are tried: the first whose count equals the one found is named. The key is the
# failure's ``alternative`` field (what xfails entries match) and the name of its count among
# what was derived (checks/derived.py); the annotation is its message's wording.
ALTERNATIVES = (
    ("unbucketed", "the count without bucketing", lambda sharding, bucketing: (sharding, "none")),
    ("zero2", "the count under ZERO2", lambda sharding, bucketing: ("zero2", bucketing)),
)
# the alternative a forbidden count of a scenario may equal: what the training issues
TRAINING = ("training", "the training's count")


def alternative_counts(
    module: torch.nn.Module, sharding: str, bucketing: str, replicated: bool = False
) -> list[tuple[tuple[str, str], dict]]:
    """((key, annotation), counts) of each recognised alternative that differs from the cell
    itself (under DDP only the count without bucketing: sharding does not apply)."""
    out = []
    for key, annotation, alternative in ALTERNATIVES:
        alt_sharding, alt_bucketing = alternative(sharding, bucketing)
        if replicated and alt_sharding != sharding:
            continue
        if (alt_sharding, alt_bucketing) != (sharding, bucketing):
            out.append(((key, annotation), expected_counts(module, alt_sharding, alt_bucketing, replicated)))
    return out


def named_alternative(
    alternatives: list[tuple[tuple[str, str], dict]], phase: str, kind: str, got: int
) -> tuple[str, str] | None:
    """(key, annotation) of the first alternative whose count of ``kind`` in ``phase`` is ``got``."""
    return next((named for named, counts in alternatives if counts[phase][kind] == got), None)


SEQUENCE = "collective sequence"  # the metric every rank of a world must agree on (sequences_differ)


def sequence(traces: dict[str, Any]) -> list[str]:
    """Every collective of the traces in the order issued: phase, kind, dtype and bytes out.
    Ranks whose sequences differ would deadlock or mismatch buffers in a real world."""
    return [f"{phase} {kind} {_described(b)}" for phase, t in traces.items() for kind, b in issued(t)]


def _described(bsym: Any) -> str:
    """A collective's output as ``dtype bytes``, or what is wrong with it."""
    if not bsym.flat_proxy_outs:
        return "without an output"
    out = bsym.flat_proxy_outs[0]
    return f"{str(out.dtype).removeprefix('thunder.dtypes.')} {proxy_bytes(out)} B"


def check(run: CellRecord | SimulatedRecord) -> Findings:
    if COMPOSITIONS[run.cell.composition].parallelism == "torch":
        return check_process_group(run)
    found = Findings()
    cell = run.cell
    traces = run.traces.by_phase()
    for phase in (phase for phase, t in traces.items() if t is None):
        found.fail("collectives.trace_missing", f"{phase} trace: {MISSING.format(phase)}", phase=phase)
    traces = {phase: t for phase, t in traces.items() if t is not None}
    symbols = {phase: collective_symbols(t) for phase, t in traces.items()}
    in_order = sequence(traces)
    found.metrics[SEQUENCE] = in_order
    found.metrics[f"{SEQUENCE} digest"] = hashlib.sha1("\n".join(in_order).encode()).hexdigest()[:16]
    replicated = COMPOSITIONS[cell.composition].replicated
    hybrid = COMPOSITIONS[cell.composition].hybrid
    expected = expected_counts(run.eager_model, cell.sharding, cell.bucketing, replicated, hybrid)
    alternatives = alternative_counts(run.eager_model, cell.sharding, cell.bucketing, replicated)
    references = reference_counts(run.eager_model, cell.sharding, cell.bucketing, replicated)
    for phase, found_in in symbols.items():
        for kind in KINDS:
            got = len(found_in[kind])
            named = named_alternative(alternatives, phase, kind, got)
            want = expected[phase][kind]
            _count(found, phase, kind, got, want, named, _derived(want, references, phase, kind))
        gathered = collections.Counter(
            b.flat_proxy_args[0].name if b.flat_proxy_args else "(no input)" for b in found_in["all_gather"]
        )
        twice = sorted(name for name, n in gathered.items() if n > 1)
        with found.expect("collectives.gathered_twice", f"{phase} gathers each storage once", phase=phase, names=twice):
            assert not twice, f"gathered more than once: {twice}"
    # hybrid sharding shards within a row of the mesh: FSDP's arithmetic is the row's
    world = FSDP_WIDTH if hybrid else cell.world_size
    if hybrid:
        judge_hybrid(found, symbols, run.eager_model, run.rank, cell.world_size)
    storages = distinct_storages(run.eager_model).values()
    gathered_bytes = 0 if replicated else sum(padded_bytes(p, world) for p in storages)
    if "forward" in symbols:
        got_bytes = _out_bytes(symbols["forward"]["all_gather"])
        found.equal(
            "collectives.bytes",
            "forward all-gathered bytes",
            got_bytes,
            gathered_bytes,
            bytes_derived(gathered_bytes, world),
            phase="forward",
            kind="all_gather",
        )
    for label, backward in backward_traces(run):
        if backward is None:  # said above
            continue
        judge_backward(found, label, backward, run.eager_model, world, replicated, bytes_=True)
    record = getattr(run, "scenario", None)
    setup = getattr(run, "setup", None)
    judge_waits(found, [*(setup.unwaited if setup is not None else ()), *(record.unwaited if record else ())])
    if record is not None and record.traces is not None:  # none where Thunder raised: numerics says so
        judge_scenario(found, record, expected, alternatives, gathered_bytes, references, world)
        wanted = scenario_counts(record.scenario, expected).get("backward")
        if wanted is not None and record.traces.backward is not None:  # a missing one: judge_scenario says so
            label, counts = wanted
            kind = REDUCING[replicated][0]
            # bytes only where the scenario reduces what training does (not under no_sync,
            # whose count must be 0 and says so); every reduction's dtype wherever one is issued
            must_reduce = counts[kind] == expected["backward"][kind]
            judge_backward(found, label, record.traces.backward, run.eager_model, world, replicated, bytes_=must_reduce)
    return found


def judge_waits(found: Findings, unwaited: list[str]) -> None:
    """Every asynchronous collective Thunder issued outside its traces was waited on
    (conformance/rank/waits.py): torch.distributed defines its result only after the wait, so
    one never waited on is read too early wherever the backend runs it apart (NCCL's stream).
    Judged by the call, not by values: on gloo the values usually land in time."""
    for each in unwaited:
        phase, _, call = each.partition(": ")
        found.fail("collectives.unwaited", f"{each}: issued asynchronously, never waited on", phase=phase, call=call)


def check_process_group(run: CellRecord) -> Findings:
    """Under PyTorch's parallelism: what each training step issued at the process group
    (conformance/rank/process_group.py), against FSDP2's arithmetic from the model and the world
    size (checks/fsdp2.py), or DDP's buckets from the model (checks/torch_ddp.py). Per phase, the
    steps that issued alike and were owed alike are judged once (``forward``), and where some
    differ each group under its own label (``forward of steps 0, 1``)."""
    found = Findings()
    cell = run.cell
    in_order = [f"{i.phase} {i.kind} {i.dtype} {i.nbytes} B" for s in run.steps for i in s.issued or ()]
    found.metrics[SEQUENCE] = in_order
    found.metrics[f"{SEQUENCE} digest"] = hashlib.sha1("\n".join(in_order).encode()).hexdigest()[:16]
    # what each training step owes, and last what a step after them owes (a scenario's base)
    if COMPOSITIONS[cell.composition].replicated:
        wants = [torch_ddp.expected(run.eager_model, k) for k in range(len(run.steps) + 1)]
    else:  # FSDP2 owes every step alike
        mixed = MIXED.get(cell.dtype)
        wrap = COMPOSITIONS[cell.composition].fsdp2_wrap
        wants = [fsdp2.expected(run.eager_model, cell.sharding, cell.world_size, mixed, wrap)] * (len(run.steps) + 1)
    for phase in fsdp2.PHASES:
        groups: dict[tuple, list[int]] = {}
        for k, step in enumerate(run.steps):
            tally = tuple(sorted(_tally(step.issued or (), phase).items()))
            groups.setdefault((tally, tuple(sorted(wants[k][phase].items()))), []).append(k)
        for (tally, _), steps in groups.items():
            label = phase if len(groups) == 1 else f"{phase} of steps {', '.join(map(str, steps))}"
            _judge_tally(found, label, dict(tally), wants[steps[0]][phase], cell.world_size)
    record = run.scenario
    if record is not None and record.issued is not None:
        wanted = scenario_wanted(record.scenario, wants[-1])  # it runs after training
        for phase in fsdp2.PHASES:
            label = f"{record.scenario} {phase}"
            _judge_tally(found, label, _tally(record.issued, phase), wanted.get(phase, {}), cell.world_size)
    return found


def check_tensor_parallel(run: TensorParallelRecord) -> Findings:
    """What each step of a tensor-parallel cell issued at the process group, against
    Megatron's arithmetic (checks/megatron.py): every step owes the same, so steps that issued
    alike are judged once (``forward``), others each under their own label."""
    found = Findings()
    in_order = [f"{i.phase} {i.kind} {i.dtype} {i.nbytes} B" for s in run.steps for i in s.issued]
    found.metrics[SEQUENCE] = in_order
    found.metrics[f"{SEQUENCE} digest"] = hashlib.sha1("\n".join(in_order).encode()).hexdigest()[:16]
    want = megatron.expected(run.layers, run.trained)
    for phase in megatron.PHASES if run.trained else ("forward",):
        groups: dict[tuple, list[int]] = {}
        for k, step in enumerate(run.steps):
            groups.setdefault(tuple(sorted(_tally(step.issued, phase).items())), []).append(k)
        for tally, steps in groups.items():
            label = phase if len(groups) == 1 else f"{phase} of steps {', '.join(map(str, steps))}"
            _judge_tally(found, label, dict(tally), want.get(phase, {}), run.world_size)
    return found


def scenario_wanted(scenario: str, want: dict[str, dict[str, fsdp2.Expected]]) -> dict[str, dict[str, fsdp2.Expected]]:
    """Under PyTorch's parallelism, what a scenario issues per phase, from what a training step
    issues (``want``): ``infer``'s no_grad forward all-gathers each FSDP2 unit as training's does
    and nothing more; ``reshape``'s forward and backward move the same parameters whatever the
    input's shape; ``accumulate``'s micro-steps each gather as a step does, and only the last,
    synced, reduces (what the skipped ones accumulated with its own: FSDP2's reduce-scatter,
    DDP's all-reduce). DDP's buffers are broadcast before the first micro-step's forward
    alone: the next follows a forward that skipped the sync. None steps."""
    if scenario == "infer":
        return {"forward": want["forward"]}
    if scenario == "reshape":
        return {"forward": want["forward"], "backward": want["backward"]}
    assert scenario == "accumulate", scenario
    times = {"all_gather": MICRO_STEPS}  # per micro-step; every other kind once
    return {
        phase: {
            kind: fsdp2.Expected(e.count * times.get(kind, 1), e.nbytes * times.get(kind, 1))
            for kind, e in want[phase].items()
        }
        for phase in ("forward", "backward")
    }


def _tally(calls: Iterable[Issued], phase: str) -> dict[str, fsdp2.Expected]:
    """What ``calls`` holds of ``phase``: per kind, the count and the bytes."""
    tally = {kind: fsdp2.Expected() for kind in fsdp2.KINDS}
    for i in calls:
        if i.phase == phase:
            had = tally.get(i.kind, fsdp2.Expected())
            tally[i.kind] = fsdp2.Expected(had.count + 1, had.nbytes + i.nbytes)
    return tally


def _judge_tally(
    found: Findings, label: str, tally: dict[str, fsdp2.Expected], wanted: dict[str, fsdp2.Expected], world: int
) -> None:
    for kind, got in tally.items():
        want = wanted.get(kind, fsdp2.Expected())
        _count(found, label, kind, got.count, want.count, None)
        if want.count and got.count:  # a missing or stray collective: its count says so
            found.equal(
                "collectives.bytes",
                f"{label} {kind} bytes",
                got.nbytes,
                want.nbytes,
                bytes_derived(want.nbytes, world),
                phase=label,
                kind=kind,
            )


def backward_traces(run: CellRecord | SimulatedRecord) -> list[tuple[str, Any]]:
    """The distinct backward traces the training steps ran, labelled for findings:
    ``backward`` where every step ran the same one (Thunder's cache: the usual case), else
    ``backward of steps ...`` per trace; a simulated world's one backward is ``backward``."""
    steps = getattr(run, "steps", None)
    traces = [s.backward_trace for s in steps if s.backward_trace is not None] if steps else []
    if not traces:
        return [("backward", run.traces.backward)] if run.traces is not None else []
    ran: dict[int, tuple[Any, list[int]]] = {}
    for k, step in enumerate(steps):
        if step.backward_trace is not None:
            ran.setdefault(id(step.backward_trace), (step.backward_trace, []))[1].append(k)
    if len(ran) == 1:
        return [("backward", traces[0])]
    return [(f"backward of steps {', '.join(map(str, ks))}", t) for t, ks in ran.values()]


def scenario_counts(scenario: str, expected: dict[str, dict[str, int]]) -> dict[str, tuple[str, dict[str, int]]]:
    """Per trace a scenario compiled (forward, backward): how findings name it and what it
    must issue, from what the training's traces must. Under no_grad: the training forward's
    gathers and nothing reduced (there is no gradient; nor a backward). With the sync skipped:
    the training's gathers, and nothing reduced in the backward (reducing is what skipping
    skips). At a second input shape: what the training's traces issue (a collective's count
    does not depend on the batch)."""
    forward, backward = expected["forward"], expected["backward"]
    nothing_reduced = {"reduce_scatter": 0, "all_reduce": 0}
    if scenario == "infer":
        return {"forward": ("no_grad forward", {**forward, **nothing_reduced})}
    if scenario == "accumulate":
        return {
            "forward": ("no_sync forward", forward),
            "backward": ("no_sync backward", {**backward, **nothing_reduced}),
        }
    return {"forward": ("second shape forward", forward), "backward": ("second shape backward", backward)}


def judge_scenario(
    found: Findings,
    record: Any,
    expected: dict[str, dict[str, int]],
    alternatives: list[tuple[str, dict]],
    gathered_bytes: int,
    references: dict[str, dict] | None = None,
    world_size: int = 1,
) -> None:
    """The traces the cell's scenario compiled, counted against ``scenario_counts``; every
    forward gathers the bytes the training forward gathers."""
    traces = record.traces.by_phase()
    for phase, (label, want) in scenario_counts(record.scenario, expected).items():
        trace = traces.get(phase)
        with found.expect("collectives.trace_missing", f"{label} trace", phase=label):
            assert trace is not None, "Thunder compiled none"
        if trace is None:
            continue
        found_in = collective_symbols(trace)
        for kind in KINDS:
            got = len(found_in[kind])
            # a count the scenario keeps may equal an alternative's; one it forbids may be the
            # training's (Thunder compiled the scenario like a training step), as the cell
            # expects it or as a recognised alternative issues it (a skipped sync that reduces
            # beside bucketing that is not applied reduces once per parameter)
            trained = {expected[phase][kind], *(counts[phase][kind] for _, counts in alternatives)}
            if want[kind]:
                named = named_alternative(alternatives, phase, kind, got)
            else:
                named = TRAINING if got and got in trained else None
            _count(found, label, kind, got, want[kind], named, _derived(want[kind], references, phase, kind))
        if phase == "forward":
            got_bytes = _out_bytes(found_in["all_gather"])
            found.equal(
                "collectives.bytes",
                f"{label} all-gathered bytes",
                got_bytes,
                gathered_bytes,
                bytes_derived(gathered_bytes, world_size),
                phase=label,
                kind="all_gather",
            )


def reference_counts(
    module: torch.nn.Module, sharding: str, bucketing: str, replicated: bool = False
) -> dict[str, dict[str, dict[str, int]]]:
    """The cell's counts under each alternative, named as xfails templates name them (checks/
    derived.py), even where equal to its own: ``unbucketed`` (NONE), ``zero2`` (no re-gather)."""
    return {
        "unbucketed": expected_counts(module, sharding, "none", replicated),
        "zero2": expected_counts(module, "zero2", bucketing, replicated),
    }


def _derived(
    want: int, references: dict[str, dict[str, dict[str, int]]] | None, phase: str, kind: str
) -> dict[str, float]:
    """What a count's failure carries: the count the cell expects, and each reference's count
    of the training trace of ``phase`` (a scenario's trace is named by the training's phase)."""
    return {"expected": want, **{name: counts[phase][kind] for name, counts in (references or {}).items()}}


def _count(
    found: Findings,
    phase: str,
    kind: str,
    got: int,
    want: int,
    named: tuple[str, str] | None,
    derived: dict[str, float] | None = None,
) -> None:
    """A count of collectives against the model's, recorded as ``Findings.equal`` records it;
    a wrong count says which alternative it equals, where it equals one (``collectives.count``:
    phase, kind, got and the alternative's key)."""
    what = f"{phase} {kind}s"
    found.metrics[what] = {"expected": want, "actual": got}
    key, annotation = named or (None, None)
    with found.expect(
        "collectives.count", what, derived or {"expected": want}, phase=phase, kind=kind, got=got, alternative=key
    ):
        assert got == want, f"expected {want}, got {got}" + (f" ({annotation})" if annotation else "")


def _out_bytes(bsyms: list[Any]) -> int:
    """Bytes the collectives ``bsyms`` declare as their outputs (one without an output adds
    none: the byte count then falls short, a finding; the sequence names it)."""
    return sum(proxy_bytes(b.flat_proxy_outs[0]) for b in bsyms if b.flat_proxy_outs)


def sequences_differ(ranks: list[int], findings: list[Findings]) -> list[Across]:
    """Ranks whose collectives, in the order issued, differ from the first rank's: in a real
    world they would deadlock or exchange mismatched buffers. One failure per group of ranks
    that issued the same sequence (``collectives.sequence``: where it first differs, what
    they issued there and what the first rank did)."""
    issued = {rank: f.metrics.get(SEQUENCE) for rank, f in zip(ranks, findings, strict=True)}
    if not issued:
        return []
    first, *_ = issued
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank, seq in issued.items():
        groups.setdefault(tuple(seq or ()), []).append(rank)
    ours = tuple(issued[first] or ())
    out = []
    for seq, members in groups.items():
        if seq == ours:
            continue
        at = next((i for i, (a, b) in enumerate(zip(ours, seq, strict=False)) if a != b), min(len(ours), len(seq)))
        theirs = seq[at] if at < len(seq) else "nothing"
        mine = ours[at] if at < len(ours) else "nothing"
        message = (
            f"collective sequence differs from rank {first}'s ({len(seq)} collectives, rank {first} "
            f"{len(ours)}): at #{at} {theirs}, rank {first} {mine}"
        )
        fields = {"at": at, "got": theirs, "first_rank": mine}
        out.append(Across(Failure("collectives.sequence", message, fields), members))
    return out


AREA = Area(
    "collectives",
    check,
    parallelisms=frozenset({"thunder", "torch"}),
    simulated=check,
    tensor_parallel=check_tensor_parallel,
    hybrid=True,
    across_ranks=sequences_differ,
    per_rank_omits=frozenset({SEQUENCE}),
)

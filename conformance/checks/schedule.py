"""Schedule: when Thunder's final traces issue each collective and wait for it, against the
order Thunder's own scheduling pass promises, so that communication overlaps compute.

Thunder (``thunder/__init__.py``, after the joint forward-backward trace is claimed by the
executors) runs ``thunder.distributed.utils.maybe_sort_waits``: wherever the trace holds a
wait, ``sort_waits`` re-sorts it top down, at each step taking, of the symbols whose inputs
are all computed, a collective first, else any other symbol in trace order, a wait only when
nothing else can run, the return last. The forward and backward traces are cut from that
trace with its order kept, so each of them shows (bookkeeping symbols aside: ``del``,
unpacking, comments, the return, the reference offloading transform's copies):

- issued when ready: between a collective and the last symbol its inputs need (the start of
  the trace for a parameter's all-gather) nothing but other collectives;
- waited when needed: after a wait, every compute symbol needs that wait or a later one
  (directly or through what it reads): no compute that could have run first. So between a
  wait and the first use of what it returns stands no compute that use does not need, and
  another wait only where nothing else could run (waits are taken in the order their
  collectives were issued, not by which one the next compute needs);
- every collective has exactly one wait in the same trace, and every wait a collective.

The pin calls neither ``limit_in_flight_allgathers`` nor ``sort_communication_ops`` (they
exist in the same module), so every collective is in flight from when it is ready to its
wait. Thunder's older split applied them to ZERO3 under ``fsdp(jit(m))``: there an all-gather
may stand back while ``ZERO3_ALL_GATHERS_IN_FLIGHT`` are in flight, and is late only where it
stood back with fewer. The most in flight is recorded, not judged.
"""

from __future__ import annotations

from typing import Any

from conformance.checks.area import Area
from conformance.checks.findings import Findings
from conformance.checks.record import CellRecord, SimulatedRecord
from conformance.checks.timeline import BOOKKEEPING, COMPUTE, WAIT, Issue, Timeline, timeline
from conformance.checks.traces import KINDS

# Thunder's ZERO3 design as its older forward/backward split applies it (``split_forward_backward``
# under ``fsdp(jit(m))``: ``sort_communication_ops``, then ``limit_in_flight_allgathers(trace, 3,
# ...)``): an all-gather may be held back while 3 are in flight, to bound the gathered memory.
# The pin calls neither and issues every all-gather when ready, which this allows too.
ZERO3_ALL_GATHERS_IN_FLIGHT = 3
# how findings name the traces a scenario compiled (as the collectives area names them)
SCENARIO_LABELS = {"infer": "no_grad", "accumulate": "no_sync", "reshape": "second shape"}


def labelled_traces(run: CellRecord | SimulatedRecord) -> list[tuple[str, Any]]:
    """(label, trace) of every trace the cell ran: the training's forward and backward, then
    the scenario's where it compiled traces of its own."""
    out: list[tuple[str, Any]] = []
    if run.traces is not None:
        out += [(phase, t) for phase, t in run.traces.by_phase().items() if t is not None]
    record = getattr(run, "scenario", None)
    if record is not None and record.traces is not None:
        seen = {id(t) for _, t in out}
        prefix = SCENARIO_LABELS.get(record.scenario, record.scenario)
        phases = record.traces.by_phase().items()
        out += [(f"{prefix} {phase}", t) for phase, t in phases if t is not None and id(t) not in seen]
    return out


def _who(issue: Issue) -> str:
    return f"the {issue.kind} of {issue.name} (bound symbol {issue.at})"


def _count(bad: list[str], total: int, what: str) -> str:
    return f"{len(bad)} of {total} {what}; first: {bad[0]}"


def in_flight_at(issues: list[Issue], position: int) -> int:
    """How many of ``issues`` are issued before ``position`` and not waited before it (a
    wait's own collective is in flight at the wait: the slot frees after it)."""
    return sum(1 for i in issues if i.at < position and (i.waited is None or i.waited >= position))


def issued_late(line: Timeline, issues: list[Issue], cap: int | None = None) -> list[str]:
    """Each collective issued after compute or a wait that stands between it and its inputs.
    ``cap``: a collective may wait for its issue where ``cap`` of its kind are in flight (the
    ZERO3 limit below); it is late only where it stood back with fewer in flight."""
    bad = []
    for issue in issues:
        between = line.compute_between(issue.ready, issue.at)
        if cap is not None:
            between = [j for j in between if in_flight_at(issues, j) < cap]
        if between:
            since = "the trace's start" if issue.ready < 0 else f"bound symbol {issue.ready}"
            bad.append(
                f"{_who(issue)} is ready at {since} but issued after {len(between)} other symbols "
                f"({line.names[between[0]]} at {between[0]} first)"
            )
    return bad


def waited_early(line: Timeline, issue_at_wait: dict[int, Issue]) -> dict[str, list[str]]:
    """Per kind, each wait followed (before the next wait) by compute that needs neither it
    nor any later wait; the wait blamed is the last one before that compute."""
    bad: dict[str, list[str]] = {}
    first_at: dict[int, int] = {}  # position -> index of its first wait
    for k, at in enumerate(line.wait_positions):
        first_at.setdefault(at, k)
    last_wait = None  # position of the last wait before the current symbol
    blamed: set[int] = set()
    for j, role in enumerate(line.roles):
        unblamed = role == COMPUTE and last_wait is not None and last_wait not in blamed
        if unblamed and not line.needs[j] >> first_at[last_wait]:
            blamed.add(last_wait)
            issue = issue_at_wait.get(last_wait)
            kind = issue.kind if issue is not None else "wait"
            of = f"the wait for {_who(issue)}" if issue is not None else "a wait"
            bad.setdefault(kind, []).append(
                f"{of} at bound symbol {last_wait} stands before {line.names[j]} (bound symbol {j}), "
                "which needs neither it nor any later wait"
            )
        if role == WAIT:
            last_wait = j
    return bad


def first_use(line: Timeline, issue: Issue) -> int | None:
    """Position of the first symbol that reads what ``issue``'s wait returns (None: nothing in
    the trace reads it: it is returned or saved)."""
    if issue.waited is None:
        return None
    uses = [u for n in issue.wait_outputs for u in line.consumers.get(n, []) if u > issue.waited]
    return min(uses, default=None)


def in_flight(line: Timeline, issues: list[Issue]) -> int:
    """The most of ``issues`` issued and not yet waited at any position."""
    events = sorted([(i.at, 1) for i in issues] + [(i.waited, -1) for i in issues if i.waited is not None])
    most = now = 0
    for _, step in events:  # at one position a wait (-1) sorts before an issue (+1)
        now += step
        most = max(most, now)
    return most


def judge(found: Findings, label: str, trace: Any, zero3: bool = False) -> None:
    line = timeline(trace)
    issue_at_wait = {i.waited: i for i in line.issues if i.waited is not None}
    early = waited_early(line, issue_at_wait)
    with found.expect("schedule.stray_wait", f"{label} waits on a collective", trace=label):
        assert not line.stray_waits, (
            f"{len(line.stray_waits)} waits on futures no collective of this trace issued "
            f"({line.stray_waits[0][1]} at bound symbol {line.stray_waits[0][0]} first)"
        )
    for kind in KINDS:
        issues = [i for i in line.issues if i.kind == kind]
        if not issues:
            continue
        late = issued_late(line, issues, ZERO3_ALL_GATHERS_IN_FLIGHT if zero3 and kind == "all_gather" else None)
        uses = [(i, first_use(line, i)) for i in issues]
        to_use = [sum(r != BOOKKEEPING for r in line.roles[i.waited + 1 : u]) for i, u in uses if u is not None]
        sync = [_who(i) for i in issues if i.future is None]
        never = [_who(i) for i in issues if i.future is not None and i.waited is None]
        distances = [
            sum(r != BOOKKEEPING for r in line.roles[i.at + 1 : i.waited]) for i in issues if i.waited is not None
        ]
        found.metrics[f"{label} {kind}s"] = {
            "issued": len(issues),
            "max in flight": in_flight(line, issues),
            "issue-to-wait distance": {
                "min": min(distances, default=0),
                "max": max(distances, default=0),
                "mean": round(sum(distances) / len(distances), 2) if distances else 0,
            },
            "issued late": len(late),
            "waited early": len(early.get(kind, [])),
            "wait-to-first-use distance": {"max": max(to_use, default=0)},
            "results unused": len(issues) - len(to_use),
        }
        where = {"trace": label, "kind": kind}
        with found.expect("schedule.synchronous", f"{label} {kind}s asynchronous", **where):
            assert not sync, _count(sync, len(issues), "issued synchronously (no future to wait on)")
        with found.expect("schedule.never_waited", f"{label} {kind}s waited", **where):
            assert not never, _count(never, len(issues), "never waited in this trace")
        with found.expect("schedule.issued_late", f"{label} {kind}s issued when ready", **where):
            assert not late, _count(late, len(issues), "issued later than their inputs allow")
        with found.expect("schedule.waited_early", f"{label} {kind} waits when needed", **where):
            early_ones = early.get(kind, [])
            assert not early_ones, _count(early_ones, len(issues), "waited before compute that does not need them")


def check(run: CellRecord | SimulatedRecord) -> Findings:
    found = Findings()
    traces = labelled_traces(run)
    with found.expect("schedule.no_trace", "traces"):
        assert traces, "Thunder kept no trace of the cell"
    zero3 = run.cell.sharding == "zero3"
    for label, trace in traces:
        judge(found, label, trace, zero3)
    return found


AREA = Area("schedule", check, simulated=check)

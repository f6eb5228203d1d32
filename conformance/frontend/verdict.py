"""The verdict of one item: run (or reuse) its cell, then hold one check area of it to
account through the area's hooks alone (its checks' findings per rank, its judgment across
ranks and against a baseline). Failures are grouped by message across ranks; those whose
code and fields an xfails entry names become an expected failure, any other fails the item
with a one-line repro, and an item that an entry covers but that conforms fails too, naming
the stale entry by FILE:LINE."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from conformance.checks.findings import CellResult, Failure, returned_wrong
from conformance.checks.registry import AREAS, applies
from conformance.frontend import baseline, ledger
from conformance.frontend.blame import KIT, THUNDER, Blame, KitError, blame, in_thunder
from conformance.frontend.known_elsewhere import explains_all, known_elsewhere, raise_known_elsewhere
from conformance.frontend.runner import Runner
from conformance.frontend.templates import Raise
from conformance.frontend.xfails import Expectation, KnownNonConformance
from conformance.matrix import simulated
from conformance.matrix.cells import Cell
from conformance.reports.outcomes import UNSUPPORTED
from conformance.world import protocol
from conformance.world.outcome import Outcome


class Conformance:
    """Bound to one test item: runs (or reuses) a cell and holds one check area to account."""

    def __init__(self, runner: Runner, node: pytest.Item) -> None:
        self.runner = runner
        self.node = node

    def expect_all(self, cell: Cell) -> None:
        """Every check area that applies to ``cell`` must conform (for generated cells, which
        are not items of their own)."""
        for area in AREAS:
            if applies(cell, area):
                self.expect(cell, area, record=False)

    def replay_line(self, cell: Cell) -> str:
        return shlex.join(
            [
                "python",
                "-m",
                "pytest",
                "conformance/test_generated.py::test_replay",
                "--replay",
                json.dumps(cell.axes()),
            ]
        )

    def expect(self, cell: Cell, area: str, record: bool = True) -> None:
        """Hold ``area`` of ``cell`` to account. Any exception of the kit's own code (here, or in
        a rank's check) ends as a KitError, which the plugin reports as a pytest error."""
        try:
            self._expect(cell, area, record)
        except (KnownNonConformance, KitError):
            raise
        except Exception as exc:  # pytest's own outcomes (fail, skip) are BaseExceptions: not caught
            who = blame(protocol.frames_of(exc))
            raise KitError(_kit_message(cell, area, who, f"{type(exc).__name__}: {exc}", "")) from exc

    def _expect(self, cell: Cell, area: str, record: bool) -> None:
        outcome = self.runner.run(cell)
        # each rank's answer, where it gave one
        answers = [CellResult.from_json(r.value) if r.ok else None for r in outcome.results]
        if record:
            self._record(cell, area, outcome, answers)
        repro = f"repro: {self.replay_line(cell) if cell.spec else self.runner.session.repro(self.node.nodeid)}"
        if not outcome.ok:
            wrong = {r.rank: m for r in outcome.results if (m := returned_wrong(r.error)) is not None}
            if wrong:  # a rank could not read on what Thunder returned: Thunder's non-conformance
                lines = [f"{cell.id} does not conform ({area}): the cell stopped on what Thunder returned"]
                lines += [f"  ranks {list(wrong)}: {m}" for m in sorted(set(wrong.values()))]
                pytest.fail("\n".join([*lines, repro]), pytrace=False)
            _raise_if_kit(cell, area, outcome, repro)
            names = _rank_names(cell, len(outcome.results))
            head = f"cell {cell.id} did not run to completion{_lost(outcome, names) or _thunder_raised(outcome)}"
            others = self._expected_raise(cell, area, outcome, f"{head}  [expected: xfails]\n{repro}")
            pytest.fail("\n".join([head, outcome.describe(names), *others, repro]), pytrace=False)
        results = [a for a in answers if a is not None]
        unsupported = {r.unsupported for r in results if r.unsupported is not None}
        if unsupported:
            pytest.skip(UNSUPPORTED + " | ".join(sorted(unsupported)))
        ranks = _rank_names(cell, len(results))
        judged = AREAS[area]
        failures = Grouped()
        for rank, r in zip(ranks, results, strict=True):
            for failure in r.areas[area].found:
                failures.add(failure, [rank])
        if judged.across_ranks is not None:
            answered = [
                (rank, r.areas[area]) for rank, r in zip(ranks, results, strict=True) if r.areas[area].crash is None
            ]
            if answered:
                for across in judged.across_ranks([rank for rank, _ in answered], [f for _, f in answered]):
                    failures.add(across.failure, across.ranks)
        for rank, result in zip(ranks, results, strict=True):
            if (crash := result.areas[area].crash) is None:
                continue
            who = blame(crash.frames)
            if who.owner != THUNDER:
                raise KitError(_kit_message(cell, area, who, f"rank {rank}: a check raised", crash.error))
            # a check asked Thunder (its traces, its state dict) and Thunder raised: its failure
            last = crash.error.strip().splitlines()[-1]
            frame = who.frame
            at = f"{in_thunder(frame)}:{frame.function}" if frame is not None else "?"
            message = f"asking Thunder raised at {frame}: {last}"
            fields = {"at": at, "raised": last.split(":", 1)[0]}
            failures.add(Failure(f"{area}.thunder_raised", message, fields), [rank])
        for failure in baseline.judged(judged, cell.id, self.runner.baseline, results[0].areas[area]):
            failures.add(failure, [0])
        self._judge(cell, area, failures, repro, record)

    def _expected_raise(self, cell: Cell, area: str, outcome: Outcome, known_message: str) -> list[str]:
        """A cell that ended with Thunder's raise: KnownNonConformance where a ``raises`` entry
        holding for the cell expects that raise; else the lines naming the raises the entries
        covering it expect instead (none: no entry expects one). Where raise templates name the
        cell, the ledger learns which did and which matched."""
        backend = self.runner.session.backend
        named = [(e, i) for e in self.runner.known(cell, area) for i in e.raise_templates_for(cell, backend)]
        raised = _raise_of(outcome)
        matched = [(e.source, i) for e, i in named if raised is not None and e.templates[i].raised(raised)]
        if named:
            ledger.note(self.node, [(e.source, i) for e, i in named], {"raise": matched})
        if matched:
            raise KnownNonConformance(known_message)
        if raised is None:
            return [f"{e.source}: expects {e.templates[i].text}, not a raise of Thunder's" for e, i in named]
        what = f"{raised.type} at {raised.file}:{raised.function}"
        # entries for other Thunder versions excuse nothing, but say the raise is upstream's
        elsewhere = raise_known_elsewhere(
            cell, area, self.runner.thunder_version, backend, self.runner.expectations, raised
        )
        return [f"{e.source}: expects {e.templates[i].text}, not {what}" for e, i in named] + [
            k.note for k in elsewhere
        ]

    def _judge(self, cell: Cell, area: str, failures: Grouped, repro: str, record: bool) -> None:
        """The item's verdict on its failures (grouped by message across ranks): conforms
        (returns), known (KnownNonConformance), stale or not conforming (pytest.fail). Entries
        match a failure's code and fields, never its message. Which templates named the cell
        and which matched go to the item's ``xfail_templates`` property, for the run's ledger
        (frontend/ledger.py)."""
        backend = self.runner.session.backend
        known = self.runner.known(cell, area)
        matched = {
            msg: [(e.source, i) for e in known for i in e.matching(failure, cell, backend)]
            for msg, failure in failures.first.items()
        }
        ledger.note(self.node, [(e.source, i) for e in known for i in e.templates_for(cell, backend)], matched)
        if not failures.ranks:
            if known:  # never a silent XPASS: the entry would mask the next regression
                pytest.fail(_stale(cell, area, known, repro), pytrace=False)
            return
        unexplained = [failures.first[msg] for msg in failures.ranks if not matched[msg]]
        lines = [f"{cell.id} does not conform ({area}):"]
        lines += [
            f"  ranks {ranks}: {msg}" + ("" if not matched[msg] else "  [expected: xfails]")
            for msg, ranks in failures.ranks.items()
        ]
        if not unexplained:
            raise KnownNonConformance("\n".join([*lines, repro]))
        # entries for other Thunder versions excuse nothing, but say which failures are upstream's
        elsewhere = known_elsewhere(
            cell, area, self.runner.thunder_version, backend, self.runner.expectations, unexplained
        )
        if record and elsewhere:
            self.node.user_properties.append(("known_elsewhere", json.dumps([k.to_json() for k in elsewhere])))
            only = explains_all(elsewhere, [f.message for f in unexplained])  # else the failure is new, in part
            self.node.user_properties.append(("known_elsewhere_only", json.dumps(only)))
        pytest.fail("\n".join([*lines, *(k.note for k in elsewhere), repro]), pytrace=False)

    def _record(self, cell: Cell, area: str, outcome: Outcome, answers: list[CellResult | None]) -> None:
        """The item's user_properties (pytest's JUnit writer turns them into <property>s)."""
        ranks = []
        names = _rank_names(cell, len(outcome.results))
        for r, answer in zip(outcome.results, answers, strict=True):
            entry = {"rank": names[r.rank], "status": r.status}
            if r.phase:  # where a rank that could not answer was
                entry["phase"] = r.phase
            if answer is not None and area in answer.areas:
                entry["failures"] = answer.areas[area].failures
                entry["codes"] = [{"code": f.code, "fields": f.fields} for f in answer.areas[area].found]
                entry["status"] = protocol.FAILED if entry["failures"] else protocol.PASSED
                if answer.areas[area].crash is not None:
                    entry["status"] = "error"  # the check raised: the kit's failure, no verdict
            ranks.append(entry)
        metrics: dict[str, object] = {"world_start_s": outcome.startup, "cell_run_s": outcome.duration}
        first = answers[0] if outcome.ok else None
        if first is not None and area in first.areas:
            metrics.update(first.areas[area].metrics)
            metrics["timings"] = first.timings
        if cell.simulated and outcome.ok:  # a few sampled ranks stand for the world: each one's numbers
            metrics["per rank"] = {  # the sequence itself is the first rank's above; here, its digest
                str(name): {k: v for k, v in a.areas[area].metrics.items() if k not in AREAS[area].per_rank_omits}
                for name, a in zip(names, answers, strict=True)
                if a is not None and area in a.areas
            }
        props = {"cell": cell.id, "area": area, "axes": cell.axes(), "ranks": ranks, "metrics": metrics}
        self.node.user_properties.extend((k, json.dumps(v)) for k, v in props.items())


def _raise_if_kit(cell: Cell, area: str, outcome: Outcome, repro: str) -> None:
    """A rank whose task raised in the kit's own code (not in Thunder's) is the kit's failure,
    unless a rank died or was stopped: a peer then raises wherever it was waiting on it."""
    if any(r.status in (protocol.DIED, protocol.STOPPED) for r in outcome.results):
        return
    for r in outcome.culprits():
        if r.status == protocol.FAILED and (who := blame(r.frames)).owner == KIT:
            detail = f"{r.error or ''}\n{repro}"
            rank = _rank_names(cell, len(outcome.results))[r.rank]
            raise KitError(_kit_message(cell, area, who, f"rank {rank}: the cell raised", detail))


def _raise_of(outcome: Outcome) -> Raise | None:
    """The raise the cell ended with where its first culprit raised in Thunder's code (a rank
    that died or hung first explains its peers' raises: then none)."""
    first = outcome.culprits()[0]
    who = blame(first.frames)
    if first.status != protocol.FAILED or who.owner != THUNDER or who.frame is None or first.exception is None:
        return None
    return Raise(first.exception["type"], first.exception["message"], in_thunder(who.frame), who.frame.function)


def _thunder_raised(outcome: Outcome) -> str:
    """Where Thunder raised, for the first rank whose task raised in Thunder's code, or ""."""
    for r in outcome.culprits():
        if r.status == protocol.FAILED and (who := blame(r.frames)).owner == THUNDER and who.frame is not None:
            return f": Thunder raised at {in_thunder(who.frame)}:{who.frame.line} in {who.frame.function}"
    return ""


def _lost(outcome: Outcome, names: list[int]) -> str:
    """The rank that went first, where one died or hung, and where it was in the cell (a
    death or a stop explains a peer's raise, never the other way round)."""
    first = outcome.culprits()[0]
    if first.status == protocol.FAILED or (first.status == protocol.TIMEOUT and not first.stopped):
        return ""
    during = f" during {first.phase}" if first.phase else ""
    return f": rank {names[first.rank]} {first.status}{during}"


def _kit_message(cell: Cell, area: str, who: Blame, what: str, detail: str) -> str:
    where = f" at {who.frame}" if who.frame is not None else ""
    head = f"the kit broke, not Thunder: {cell.id} ({area}): {what}{where}"
    return f"{head}\n{detail.rstrip()}" if detail.strip() else head


def _stale(cell: Cell, area: str, known: list[Expectation], repro: str) -> str:
    lines = [f"{cell.id} conforms ({area}), but xfails entries cover it:"]
    lines += [
        f"  {e.source}: stale: the item conforms now, so the entry must be removed or narrowed ({e.reason})"
        for e in known
    ]
    return "\n".join([*lines, repro])


def _rank_names(cell: Cell, processes: int) -> list[int]:
    """The rank each process of the cell's world was: its own, or in a simulated world the
    sampled rank it acted as."""
    return list(simulated.sampled_ranks(cell.world_size)) if cell.simulated else list(range(processes))


@dataclasses.dataclass
class Grouped:
    """An item's failures grouped by message across ranks: the ranks that report each, and the
    failure as the first of them reports it (its code, fields and what the kit derived)."""

    ranks: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    first: dict[str, Failure] = dataclasses.field(default_factory=dict)

    def add(self, failure: Failure, ranks: list[int]) -> None:
        self.first.setdefault(failure.message, failure)
        self.ranks.setdefault(failure.message, []).extend(ranks)

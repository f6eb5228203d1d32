"""The verdict of one item: run (or reuse) its cell, then hold one check area of it to
account. Failures are grouped by message across ranks; those that an xfails entry names
become an expected failure, any other fails the item with a one-line repro, and an item that
an entry covers but that conforms fails too, naming the stale entry by FILE:LINE."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import pytest

from conformance.checks.collectives import SEQUENCE
from conformance.checks.findings import CellResult, returned_wrong
from conformance.checks.registry import AREAS, applies
from conformance.frontend import baseline, ledger
from conformance.frontend.blame import KIT, THUNDER, Blame, KitError, blame
from conformance.frontend.known_elsewhere import explains_all, known_elsewhere
from conformance.frontend.runner import Runner
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
            pytest.fail(f"{head}\n{outcome.describe(names)}\n{repro}", pytrace=False)
        results = [a for a in answers if a is not None]
        unsupported = {r.unsupported for r in results if r.unsupported is not None}
        if unsupported:
            pytest.skip(UNSUPPORTED + " | ".join(sorted(unsupported)))
        ranks = _rank_names(cell, len(results))
        failures = _by_message(
            (rank, msg) for rank, r in zip(ranks, results, strict=True) for msg in r.areas[area].failures
        )
        # what the kit derived for each failure, as the first rank that reports it derived it
        derived: dict[str, dict[str, float]] = {}
        for r in reversed(results):
            derived.update(r.areas[area].derived)
        if area == "collectives":
            for msg, differing in _sequences_differ(ranks, results):
                failures.setdefault(msg, []).extend(differing)
        for rank, result in zip(ranks, results, strict=True):
            if (crash := result.areas[area].crash) is None:
                continue
            who = blame(crash.frames)
            if who.owner != THUNDER:
                raise KitError(_kit_message(cell, area, who, f"rank {rank}: a check raised", crash.error))
            # a check asked Thunder (its traces, its state dict) and Thunder raised: its failure
            last = crash.error.strip().splitlines()[-1]
            failures.setdefault(f"asking Thunder raised at {who.frame}: {last}", []).append(rank)
        if area == "memory":
            measured = results[0].areas[area].metrics["measured"]
            for msg in baseline.grown(self.runner.baseline.peaks.get(cell.id), measured):
                failures.setdefault(msg, []).append(0)
        self._judge(cell, area, failures, repro, record, derived)

    def _judge(
        self,
        cell: Cell,
        area: str,
        failures: dict[str, list[int]],
        repro: str,
        record: bool,
        derived: dict[str, dict[str, float]] | None = None,
    ) -> None:
        """The item's verdict on its failures (message -> ranks; ``derived``: message -> what
        the kit derived for it): conforms (returns), known (KnownNonConformance), stale or not
        conforming (pytest.fail). Which templates named the cell and which matched go to the
        item's ``xfail_templates`` property, for the run's ledger (frontend/ledger.py)."""
        derived = derived or {}
        backend = self.runner.session.backend
        known = self.runner.known(cell, area)
        matched = {
            msg: [(e.source, i) for e in known for i in e.matching(msg, derived.get(msg), cell, backend)]
            for msg in failures
        }
        ledger.note(self.node, [(e.source, i) for e in known for i in e.templates_for(cell, backend)], matched)
        if not failures:
            if known:  # never a silent XPASS: the entry would mask the next regression
                pytest.fail(_stale(cell, area, known, repro), pytrace=False)
            return
        unexplained = [msg for msg in failures if not matched[msg]]
        lines = [f"{cell.id} does not conform ({area}):"]
        lines += [
            f"  ranks {ranks}: {msg}" + ("" if msg in unexplained else "  [expected: xfails]")
            for msg, ranks in failures.items()
        ]
        if not unexplained:
            raise KnownNonConformance("\n".join([*lines, repro]))
        # entries for other Thunder versions excuse nothing, but say which failures are upstream's
        elsewhere = known_elsewhere(
            cell, area, self.runner.thunder_version, backend, self.runner.expectations, unexplained, derived
        )
        if record and elsewhere:
            self.node.user_properties.append(("known_elsewhere", json.dumps([k.to_json() for k in elsewhere])))
            only = explains_all(elsewhere, unexplained)  # else the failure is new, in part
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
                str(name): {k: v for k, v in a.areas[area].metrics.items() if k != SEQUENCE}
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


def _thunder_raised(outcome: Outcome) -> str:
    """Where Thunder raised, for the first rank whose task raised in Thunder's code, or ""."""
    for r in outcome.culprits():
        if r.status == protocol.FAILED and (who := blame(r.frames)).owner == THUNDER:
            return f": Thunder raised at {who.frame}"
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


def _sequences_differ(ranks: list[int], results: list[CellResult]) -> list[tuple[str, list[int]]]:
    """Ranks whose collectives, in the order issued, differ from the first rank's: in a real
    world they would deadlock or exchange mismatched buffers. (message, ranks) per group."""
    issued = {
        rank: r.areas["collectives"].metrics.get(SEQUENCE)
        for rank, r in zip(ranks, results, strict=True)
        if r.areas["collectives"].crash is None
    }
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
        out.append(
            (
                f"collective sequence differs from rank {first}'s ({len(seq)} collectives, rank {first} "
                f"{len(ours)}): at #{at} {theirs}, rank {first} {mine}",
                members,
            )
        )
    return out


def _by_message(pairs: Iterator[tuple[int, str]]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for rank, msg in pairs:
        grouped.setdefault(msg, []).append(rank)
    return grouped

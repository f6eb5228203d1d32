"""The session: cosmic-ray's work database (sqlite), one work item per mutant and one result
per mutant judged, so that an analysis stopped anywhere resumes with the mutants not yet
judged. The kit's verdict (conformance/mutants/kills.py) is kept as JSON in the result's
output, beside cosmic-ray's coarse killed / survived / incompetent."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cosmic_ray.work_db import WorkDB, WorkResultStorage
from cosmic_ray.work_item import MutationSpec, TestOutcome, WorkerOutcome, WorkItem, WorkResult

from conformance.mutants.kills import (
    EQUIVALENT,
    INCOMPETENT,
    KIT_ERROR,
    NOT_COVERED,
    RAISED,
    SILENT,
    SURVIVED,
    TIMEOUT,
    Verdict,
)
from conformance.mutants.sites import Mutant

# the kit's outcome -> cosmic-ray's (worker outcome, test outcome), for its own tools
_COARSE = {
    SILENT: (WorkerOutcome.NORMAL, TestOutcome.KILLED),
    RAISED: (WorkerOutcome.NORMAL, TestOutcome.KILLED),
    TIMEOUT: (WorkerOutcome.NORMAL, TestOutcome.KILLED),
    SURVIVED: (WorkerOutcome.NORMAL, TestOutcome.SURVIVED),
    INCOMPETENT: (WorkerOutcome.NORMAL, TestOutcome.INCOMPETENT),
    NOT_COVERED: (WorkerOutcome.SKIPPED, None),
    EQUIVALENT: (WorkerOutcome.SKIPPED, None),
    KIT_ERROR: (WorkerOutcome.ABNORMAL, None),
}


def _item(m: Mutant) -> WorkItem:
    spec = MutationSpec(
        module_path=m.path,
        operator_name=m.operator,
        occurrence=m.occurrence,
        start_pos=(m.line, 0),
        end_pos=(m.end_line, 1),
        operator_args={"source": m.source, "function": m.function},
    )
    return WorkItem.single(m.id, spec)


def _mutant(item: WorkItem) -> Mutant:
    spec = item.mutations[0]
    return Mutant(
        path=str(spec.module_path),
        source=spec.operator_args["source"],
        operator=spec.operator_name,
        occurrence=spec.occurrence,
        line=spec.start_pos[0],
        end_line=spec.end_pos[0],
        function=spec.operator_args["function"],
    )


class Session:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = WorkDB(str(path), WorkDB.Mode.create)

    def close(self) -> None:
        self.db.close()

    def add(self, mutants: Iterable[Mutant]) -> int:
        """Add the mutants not in the session yet (a larger sample extends it); how many."""
        have = {item.job_id for item in self.db.work_items}
        new = [_item(m) for m in mutants if m.id not in have]
        self.db.add_work_items(new)
        return len(new)

    def pending(self) -> list[Mutant]:
        """The mutants not judged yet, in id order (cosmic-ray hands them out at random)."""
        return sorted((_mutant(i) for i in self.db.pending_work_items), key=lambda m: m.id)

    def record(self, mutant: Mutant, verdict: Verdict, diff: str) -> None:
        worker, coarse = _COARSE[verdict.outcome]
        result = WorkResult(worker_outcome=worker, output=json.dumps(verdict.to_json()), test_outcome=coarse, diff=diff)
        self.db.set_result(mutant.id, result)

    def adopt(self, entries: Iterable[dict[str, Any]]) -> int:
        """Take the verdicts an earlier analysis's mutants.json gives (its ``mutants``) for the
        mutants this session holds and has not judged; how many. A mutant's id carries its
        file's hash, so only verdicts on this very source apply. Equivalents are the
        equivalents file's to say, and a kit error is judged again (the kit may be mended)."""
        fields = {f.name for f in dataclasses.fields(Verdict)}
        pending = {m.id: m for m in self.pending()}
        taken = 0
        for entry in entries:
            mutant = pending.get(entry.get("id", "")) if isinstance(entry, dict) else None
            if mutant is None or entry.get("outcome") in (EQUIVALENT, KIT_ERROR):
                continue
            verdict = Verdict.from_json({k: v for k, v in entry.items() if k in fields})
            self.record(mutant, verdict, entry.get("diff", ""))
            taken += 1
        return taken

    def forget(self, outcome: str) -> int:
        """Drop the verdicts of every mutant judged ``outcome`` (after the kit was fixed, say),
        so that the next run judges them again; how many."""
        ids = [m.id for m, v, _ in self.judged() if v.outcome == outcome]
        with self.db._session_maker.begin() as session:  # cosmic-ray's WorkDB deletes no result itself
            session.query(WorkResultStorage).filter(WorkResultStorage.job_id.in_(ids)).delete()
        return len(ids)

    def judged(self) -> list[tuple[Mutant, Verdict, str]]:
        """Every mutant judged so far, with its verdict and diff."""
        return sorted(
            (
                (_mutant(item), Verdict.from_json(json.loads(result.output or "{}")), result.diff or "")
                for item, result in self.db.completed_work_items
            ),
            key=lambda t: t[0].id,
        )

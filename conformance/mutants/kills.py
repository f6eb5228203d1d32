"""A mutant's outcome, read off the report.json of the suite run on its cells, as a user
reads it: which items failed, and whether their messages say a check found a difference,
Thunder raised, or the kit broke."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# outcomes
SILENT = "killed: silently wrong"  # Thunder ran on and a check found what it computed wrong
RAISED = "killed: Thunder raised"  # Thunder raised, crashed or refused what it offered before
TIMEOUT = "timed out"  # a cell ran past its deadline (Thunder hung)
SURVIVED = "survived"  # every cell that runs its lines conformed as before
INCOMPETENT = "incompetent"  # Thunder no longer imports: no cell can say anything
NOT_COVERED = "not covered"  # no cell of the map runs its lines
KIT_ERROR = "the kit broke"  # the kit's own code failed on what the mutant produced: a kit bug
EQUIVALENT = "equivalent"  # set aside by the reviewed equivalents file, never run
OUTCOMES = (SILENT, RAISED, TIMEOUT, SURVIVED, INCOMPETENT, NOT_COVERED, KIT_ERROR, EQUIVALENT)


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: str
    cells_run: int = 0  # cells judged before the verdict (the suite stops at the first failing cell)
    cell: str | None = None  # the killing cell
    areas: tuple[str, ...] = ()  # the areas that found the difference (silent kills)
    detail: str = ""  # the first line of the deciding message
    seconds: float = 0.0  # the whole trial, suite start to report
    findings: tuple[str, ...] = ()  # the killing cell's unexplained findings (the first few)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        return cls(**{**data, "areas": tuple(data.get("areas", ())), "findings": tuple(data.get("findings", ()))})


def _first_line(message: str) -> str:
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return lines[1].strip() if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")


# a finding that says Thunder raised: "asking Thunder raised at FILE:LINE", "Thunder raised
# TypeError" (a scenario's call), "get_model_state_dict raised RuntimeError"
_RAISE = re.compile(r"\braised(?: at |\s+[A-Z][\w.]*(?:Error|Exception|Exit|Interrupt)\b)")
SHOWN_FINDINGS = 8


def unexplained(message: str) -> list[str]:
    """The findings of a 'does not conform' message that no xfails entry explained."""
    findings = [line.strip() for line in message.splitlines()[1:] if line.strip().startswith(("ranks ", "xfails"))]
    return [f for f in findings if not f.endswith("[expected: xfails]")]


def raises(findings: list[str]) -> bool:
    """Whether Thunder raised somewhere in a cell's findings: then the raise is the cause and
    the rest of what differs its consequence (a mutant that makes Thunder raise proves only
    that Thunder runs), and the kill is a raise, never silently wrong."""
    return any(_RAISE.search(f) for f in findings)


def classify(report: dict[str, Any], seconds: float) -> Verdict:
    """The verdict on a run stopped after the first failing cell (``--first-failing-cell``)."""
    items = [c for c in report.get("cells", []) if "cell" in c]
    cells_run = len({c["cell"] for c in items})
    missing = report.get("cells_not_collected") or []
    errors = [c for c in items if c["outcome"] == "error"]
    if errors:
        first = errors[0]
        return Verdict(
            KIT_ERROR, cells_run, first["cell"], (first["area"],), _first_line(first.get("message", "")), seconds
        )
    failed = [c for c in items if c["outcome"] == "failed"]
    if failed:
        cell = failed[0]["cell"]
        mine = [c for c in failed if c["cell"] == cell]
        message = mine[0].get("message", "")
        statuses = {r.get("status") for c in mine for r in c.get("ranks", [])}
        if "did not run to completion" in message.splitlines()[0]:
            outcome = TIMEOUT if "timeout" in statuses else RAISED
            return Verdict(outcome, cells_run, cell, (), message.splitlines()[0], seconds)
        findings = [f for c in mine for f in unexplained(c.get("message", ""))]
        shown = tuple(findings[:SHOWN_FINDINGS])
        if raises(findings):
            return Verdict(RAISED, cells_run, cell, (), _first_line(message), seconds, shown)
        areas = tuple(sorted(c["area"] for c in mine))
        return Verdict(SILENT, cells_run, cell, areas, _first_line(message), seconds, shown)
    if not items and report.get("exit_status", 0) not in (0, 5):
        # no item ran: collection failed, which under a mutant means the composition probe
        # (Thunder's code, run before any cell) did not complete
        return Verdict(RAISED, 0, None, (), f"no cell ran (exit status {report.get('exit_status')})", seconds)
    if missing:  # the probe now refuses what the cells need: Thunder lost a capability
        return Verdict(
            RAISED, cells_run, missing[0], (), f"no item for {len(missing)} asked cells: the probe refused", seconds
        )
    lost = [c for c in items if c["outcome"] == "unsupported"]
    if lost:
        return Verdict(
            RAISED, cells_run, lost[0]["cell"], (), "unsupported: " + _first_line(lost[0].get("message", "")), seconds
        )
    return Verdict(SURVIVED, cells_run, None, (), "", seconds)

"""Outcome names of an item, read from pytest's reports, and the cell an item judges. "unsupported" is the kit's own: a
composition the Thunder under test does not offer, reported as a skip with a known prefix.
"error" is the kit's own failure (conformance/frontend/blame.py), never Thunder's. ``excuse``
reads back from a report's item why it is excused."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from conformance.matrix.cells import Cell

UNSUPPORTED = "unsupported: "  # prefix of the skip reason of an unsupported cell

# --chaos: what became of the fault planned in a cell (conformance/frontend/chaos.py judges it;
# each of the cell's items carries it in report.json, as ``chaos.verdict``)
CHAOS_LOST = "lost as planned"  # the rank was lost in the phase, and the cell's items said so
CHAOS_NOT_REACHED = "not reached"  # the rank never entered the phase: the cell ran as a clean run's
CHAOS_MISREPORTED = "lost, but misreported"  # the rank was lost there; the items' account differs

MARKS = {
    "passed": "✅",
    "failed": "❌",
    "skipped": "⏭️",
    "error": "💥",
    "xfailed": "⚠️ xfail",
    "unsupported": "🚫",
}


def cell_of(item: pytest.Item) -> Cell | None:
    """The cell an item judges (its ``cell`` parameter); None for generated models."""
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("cell") if callspec is not None else None
    return cell if isinstance(cell, Cell) else None


def plain_nodeid(nodeid: str) -> str:
    """The id a user can paste: xdist's loadgroup appends ``@<group>``."""
    return nodeid.partition("@")[0]


def is_unsupported(report: pytest.TestReport) -> bool:
    return (
        report.skipped
        and isinstance(report.longrepr, tuple)
        and report.longrepr[2].removeprefix("Skipped: ").startswith(UNSUPPORTED)
    )


def message(report: pytest.TestReport) -> str:
    """The item's message as its verdict wrote it. Under xdist the controller's copy of a
    report prints its worker first ("[gw1] linux -- Python 3.11.7 ..."), which would stand
    where a reader (and --chaos's judge) looks for the verdict's first line."""
    text = report.longreprtext
    if getattr(report, "node", None) is not None and text.startswith("[gw"):
        text = text.partition("\n")[2]
    return text


def outcome(report: pytest.TestReport) -> str:
    """One of MARKS' keys."""
    if hasattr(report, "wasxfail") and report.skipped:
        return "xfailed"  # xfails are strict: an item that passes under an entry fails
    if is_unsupported(report):
        return "unsupported"
    if report.when != "call" and report.failed:
        return "error"
    return report.outcome


def excuse(item: dict[str, Any]) -> str | None:
    """Why an item is excused, in one line: the reason of an unsupported item (its message is
    pytest's skip: ``(file, line, 'Skipped: unsupported: REASON')``) or an xfailed one's entry."""
    if item["outcome"] == "xfailed":
        text = item.get("xfail_reason")
    else:
        text = item.get("message")
        try:
            skip = ast.literal_eval(text) if isinstance(text, str) else None
        except (ValueError, SyntaxError):
            skip = None
        if isinstance(skip, tuple) and len(skip) == 3 and isinstance(skip[2], str):
            text = skip[2]
        if isinstance(text, str):
            text = text.removeprefix("Skipped: ").removeprefix(UNSUPPORTED)
    return text.strip().splitlines()[0] if isinstance(text, str) and text.strip() else None


def triage(records: list[dict[str, Any]]) -> dict[str, int]:
    """The failed items split in two for a fork's maintainer: ``known_elsewhere``, each of whose
    unexpected findings an xfails entry for other Thunder versions would explain (an upstream
    non-conformance this file was not declared for), and ``new``, the rest."""
    failed = [r for r in records if r.get("outcome") == "failed"]
    known = sum(1 for r in failed if r.get("known_elsewhere_only") is True)
    return {"new": len(failed) - known, "known_elsewhere": known}


def triage_line(triage: dict[str, int] | None) -> str:
    """``" (3 new, 81 known on other Thunder versions)"`` where any failure is known elsewhere."""
    if not triage or not triage.get("known_elsewhere"):
        return ""
    return f" ({triage['new']} new, {triage['known_elsewhere']} known on other Thunder versions)"

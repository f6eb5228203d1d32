"""Outcome names of an item, read from pytest's reports. "unsupported" is the kit's own: a
composition the Thunder under test does not offer, reported as a skip with a known prefix.
"error" is the kit's own failure (conformance/frontend/blame.py), never Thunder's."""

from __future__ import annotations

import pytest

UNSUPPORTED = "unsupported: "  # prefix of the skip reason of an unsupported cell

MARKS = {
    "passed": "✅",
    "failed": "❌",
    "skipped": "⏭️",
    "error": "💥",
    "xfailed": "⚠️ xfail",
    "unsupported": "🚫",
}


def plain_nodeid(nodeid: str) -> str:
    """The id a user can paste: xdist's loadgroup appends ``@<group>``."""
    return nodeid.partition("@")[0]


def is_unsupported(report: pytest.TestReport) -> bool:
    return (
        report.skipped
        and isinstance(report.longrepr, tuple)
        and report.longrepr[2].removeprefix("Skipped: ").startswith(UNSUPPORTED)
    )


def outcome(report: pytest.TestReport) -> str:
    """One of MARKS' keys."""
    if hasattr(report, "wasxfail") and report.skipped:
        return "xfailed"  # xfails are strict: an item that passes under an entry fails
    if is_unsupported(report):
        return "unsupported"
    if report.when != "call" and report.failed:
        return "error"
    return report.outcome

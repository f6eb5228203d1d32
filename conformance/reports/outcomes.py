"""Outcome names of an item, read from pytest's reports. "unsupported" is the kit's own: a
composition the Thunder under test does not offer, reported as a skip with a known prefix."""

from __future__ import annotations

import pytest

UNSUPPORTED = "unsupported: "  # prefix of the skip reason of an unsupported cell

MARKS = {
    "passed": "✅",
    "failed": "❌",
    "skipped": "⏭️",
    "error": "💥",
    "xfailed": "⚠️ xfail",
    "xpassed": "❗ xpass",
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
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if is_unsupported(report):
        return "unsupported"
    if report.when != "call" and report.failed:
        return "error"
    return report.outcome

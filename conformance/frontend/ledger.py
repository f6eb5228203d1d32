"""Per template staleness, judged over a whole run: a template of an xfails entry that holds
for the Thunder under test, that named at least one item that reached a verdict, and that
matched no failure of any item, fails the run, as a strict XPASS fails its item: the
non-conformance it describes is gone (or was never there), and the entry would go on excusing
whatever its other templates match.

Each item records (``note``) which templates named its cell and which matched one of its
failures, in its ``xfail_templates`` user property, so that the record crosses from xdist
workers to the controller; the ``Ledger`` (the controller's plugin) reads them from the
reports and judges at session end, before the report writer reads its verdict.

Only a run that asked for the whole profile and ran every item it collected is judged: a
template whose cells a -k, -m, a path or -x left out may match there. Where an item covered
by a template did not reach a verdict (it did not run to completion, the kit broke, the cell
is unsupported) it counts as not named: such an item fails the run by itself, or tested nothing.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from conformance.frontend.xfails import Expectation

PROPERTY = "xfail_templates"
Key = tuple[str, int]  # (the entry's FILE:LINE, the template's index in its failures)


def note(node: pytest.Item, covered: list[Key], matched: dict[str, list[Key]]) -> None:
    """Add what one verdict found to ``node``'s ``xfail_templates`` property (one property per
    item, merged over the cells a generated item judges)."""
    props = node.user_properties
    old = next((json.loads(v) for k, v in props if k == PROPERTY), {"covered": [], "matched": []})
    covered_all = {tuple(k) for k in old["covered"]} | set(covered)
    matched_all = {tuple(k) for k in old["matched"]} | {k for keys in matched.values() for k in keys}
    if not covered_all:
        return
    props[:] = [(k, v) for k, v in props if k != PROPERTY]
    props.append((PROPERTY, json.dumps({"covered": sorted(covered_all), "matched": sorted(matched_all)})))


@dataclasses.dataclass(frozen=True)
class StaleTemplate:
    entry: str  # FILE:LINE of the entry
    index: int  # the template's place in the entry's failures
    template: str  # FILE:LINE of the template
    text: str
    items: int  # the items it named that reached a verdict

    def line(self) -> str:
        return (
            f"{self.template}: stale xfails template (entry {self.entry}): {self.text!r} matched no failure "
            f"of the {self.items} items it names: remove it, or narrow its when"
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def stale_templates(
    entries: list[Expectation], thunder_version: str | None, covered: dict[Key, int], matched: set[Key]
) -> list[StaleTemplate]:
    """The templates of entries holding for ``thunder_version`` that named items (``covered``:
    key -> items) and matched none of their failures, in file order."""
    out = []
    for entry in entries:
        if not entry.holds_for(thunder_version):
            continue
        for i, template in enumerate(entry.templates):
            key = (entry.source, i)
            if covered.get(key) and key not in matched:
                out.append(StaleTemplate(entry.source, i, template.source, template.text, covered[key]))
    return out


class Ledger:
    """The controller's account of which templates matched; judges them at session end."""

    def __init__(self, entries: list[Expectation], thunder_version: str | None, whole_run: bool) -> None:
        self.entries = entries
        self.thunder_version = thunder_version
        self.whole_run = whole_run
        self.items: dict[str, dict[str, list[list[Any]]]] = {}  # nodeid -> its property
        self.finished = 0
        self.judged: str | None = None  # why the run was not judged, or None once it was
        self.stale: list[StaleTemplate] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == PROPERTY:
                self.items[report.nodeid] = json.loads(value)
        if report.when == "teardown":
            self.finished += 1

    def judge(self, collected: int, stopped: bool) -> None:
        if not self.whole_run:
            self.judged = "part of the suite (-k, -m, a path, --deselect, --lf or --replay)"
            return
        if stopped or self.finished < collected:
            self.judged = f"{self.finished} of {collected} items ran"
            return
        covered: dict[Key, int] = {}
        matched: set[Key] = set()
        for record in self.items.values():
            for source, i in record["covered"]:
                covered[(source, i)] = covered.get((source, i), 0) + 1
            matched |= {(source, i) for source, i in record["matched"]}
        self.stale = stale_templates(self.entries, self.thunder_version, covered, matched)
        self.judged = None

    def to_json(self) -> dict[str, Any]:
        return {"judged": self.judged is None, "not_judged": self.judged, "stale": [s.to_json() for s in self.stale]}

    @pytest.hookimpl(tryfirst=True)  # before the report writer reads the exit status
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.judge(session.testscollected, bool(session.shouldstop or session.shouldfail))
        if not self.stale:
            return
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        terminal = session.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line(f"exit status 1: {len(self.stale)} stale xfails templates:")
            for stale in self.stale:
                terminal.write_line(f"  {stale.line()}")

"""Entries for other Thunder versions (issue 26, real forks): a failure that an xfails entry
would explain, but whose ``thunder`` specifiers exclude the version under test, still fails;
its message, its report.json record, summary.md and the comparison name the entry, so a fork's
maintainer can tell an upstream non-conformance from a new one. No world: the verdict is
judged on failures given here, with a runner and an item stood in for."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.checks.findings import Failure
from conformance.frontend import ledger, xfails
from conformance.frontend.verdict import Conformance
from conformance.matrix.cells import Cell
from conformance.reports.comparison import compare
from conformance.reports.comparison_markdown import markdown
from conformance.reports.session import SessionInfo
from conformance.reports.writer import Reporter
from tests.support.suite_runs import ROOT
from tests.support.verdicts import on_ranks, stand_in_runner

CELL = Cell("tied_lm", "real", "fsdp_jit", bucketing="layer")
AREA = "collectives"
COUNT = {"code": "collectives.count", "phase": "forward", "kind": "all_gather"}
TEMPLATE = {**COUNT, "got": "{unbucketed}", "alternative": "unbucketed"}
# what the kit derived for each count: the cell expects 3 all-gathers, 6 without bucketing
DERIVED = {"expected": 3, "unbucketed": 6}
FAILURE = Failure(
    "collectives.count",
    "forward all_gathers: expected 3, got 6 (the count without bucketing)",
    {"phase": "forward", "kind": "all_gather", "got": 6, "alternative": "unbucketed"},
    DERIVED,
)
OTHER = Failure(  # explained by no entry of any version
    "collectives.count",
    "backward reduce_scatters: expected 3, got 7",
    {"phase": "backward", "kind": "reduce_scatter", "got": 7},
    DERIVED,
)
REASON = "bucketing_strategy is stored but not applied. One all-gather per parameter, as with NONE."
REPRO = "repro: python -m pytest conformance/test_collectives.py"
NODE = f"conformance/test_collectives.py::test_collectives[{CELL.id}]"


def entry(**fields: Any) -> xfails.Expectation:
    base = {
        "area": AREA,
        "when": {"bucketing": ["layer"]},
        "failures": [TEMPLATE],
        "reason": REASON,
        "link": "a link",
        "thunder": ["==0.2.6", "==0.2.7.dev20260201"],
        "source": "xfails.toml:12",
    }
    return xfails.Expectation(**{**base, **fields})


def judge(
    entries: list[xfails.Expectation],
    version: str | None,
    *failures: Failure,
    cell: Cell = CELL,
    area: str = AREA,
) -> tuple[type[BaseException] | None, str, list[tuple[str, str]]]:
    """The exception the verdict raised (None: conforms), its message, and the item's
    user_properties but the templates' ledger (tests/unit/test_template_ledger.py)."""
    runner = stand_in_runner(entries, version)
    node = SimpleNamespace(user_properties=[])
    try:
        Conformance(runner, node)._judge(cell, area, on_ranks(failures), REPRO, record=True)  # type: ignore[arg-type]
    except (pytest.fail.Exception, xfails.KnownNonConformance) as exc:
        return type(exc), str(exc), _without_ledger(node.user_properties)
    return None, "", _without_ledger(node.user_properties)


def _without_ledger(props: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in props if k != ledger.PROPERTY]


NOTE = (
    "known on ==0.2.6, ==0.2.7.dev20260201 (xfails.toml:12), not declared for 0.2.6.dev0: "
    "bucketing_strategy is stored but not applied."
)


def test_a_fork_version_fails_naming_the_entry_for_other_versions() -> None:
    raised, message, props = judge([entry()], "0.2.6.dev0", FAILURE)
    assert raised is pytest.fail.Exception
    lines = message.splitlines()
    assert lines[-2:] == [NOTE, REPRO]  # after the findings, before the repro
    assert "[expected: xfails]" not in message
    [(key, value), (only, every)] = props
    assert key == "known_elsewhere" and (only, json.loads(every)) == ("known_elsewhere_only", True)
    assert json.loads(value) == [
        {
            "entry": "xfails.toml:12",
            "thunder": ["==0.2.6", "==0.2.7.dev20260201"],
            "explains": [FAILURE.message],
            "note": NOTE,
        }
    ]


def test_an_entry_elsewhere_is_found_by_code_and_fields_not_the_message() -> None:
    reworded = dataclasses.replace(FAILURE, message="six all-gathers where the model implies three")
    _, message, props = judge([entry()], "0.2.6.dev0", reworded)
    assert message.splitlines()[-2] == NOTE
    assert json.loads(props[0][1])[0]["explains"] == [reworded.message]
    # the message it was excused under, on another count: nothing known
    wrong = dataclasses.replace(FAILURE, fields={**FAILURE.fields, "got": 7})
    _, message, props = judge([entry()], "0.2.6.dev0", wrong)
    assert "known on" not in message and props == []


def test_the_declared_version_is_excused_as_before() -> None:
    raised, message, props = judge([entry()], "0.2.6", FAILURE)
    assert raised is xfails.KnownNonConformance
    assert message.splitlines() == [
        f"{CELL.id} does not conform ({AREA}):",
        f"  ranks [0, 1]: {FAILURE.message}  [expected: xfails]",
        REPRO,
    ]
    assert props == []


def test_a_partial_explanation_names_the_failures_it_explains() -> None:
    raised, message, props = judge([entry()], "0.2.6.dev0", FAILURE, OTHER)
    assert raised is pytest.fail.Exception
    assert message.splitlines()[-2] == (
        "known on ==0.2.6, ==0.2.7.dev20260201 (xfails.toml:12), not declared for 0.2.6.dev0, "
        f'for 1 of the 2 unexpected failures ("{FAILURE.message}"): bucketing_strategy is stored but not applied.'
    )
    assert json.loads(props[0][1])[0]["explains"] == [FAILURE.message]
    assert props[1] == ("known_elsewhere_only", "false")  # the other failure is new on any version


def test_an_item_failing_on_the_declared_version_names_no_entry_it_already_holds() -> None:
    # the entry holds: its failure is expected, the other one fails; no "known on" line
    raised, message, props = judge([entry()], "0.2.6", FAILURE, OTHER)
    assert raised is pytest.fail.Exception
    assert "known on" not in message and props == []


@pytest.mark.parametrize(
    "other",
    [
        entry(area="memory"),  # another area
        entry(when={"bucketing": ["block"]}),  # other cells
        entry(when={"bucketing": ["layer"], "backend": ["nccl"]}),  # another backend
        entry(failures=[{**COUNT, "got": 0, "alternative": "zero2"}]),  # other failures
        entry(failures=[{**COUNT, "got": "{expected}", "alternative": "unbucketed"}]),  # another number
        entry(failures=[{**COUNT, "got": "{unbucketed}"}]),  # fewer fields
        entry(failures=[{**TEMPLATE, "code": "collectives.bytes"}]),  # another code
    ],
)
def test_an_entry_that_would_not_explain_the_failure_here_adds_nothing(other: xfails.Expectation) -> None:
    raised, message, props = judge([other], "0.2.6.dev0", FAILURE)
    assert raised is pytest.fail.Exception
    assert message.splitlines() == [
        f"{CELL.id} does not conform ({AREA}):",
        f"  ranks [0, 1]: {FAILURE.message}",
        REPRO,
    ]
    assert props == []


def test_a_failure_no_entry_explains_gets_nothing() -> None:
    raised, message, props = judge([entry()], "0.2.6.dev0", OTHER)
    assert raised is pytest.fail.Exception and "known on" not in message and props == []


def test_an_unknown_version_says_so() -> None:
    _, message, _ = judge([entry()], None, FAILURE)
    assert message.splitlines()[-2] == (
        "known on ==0.2.6, ==0.2.7.dev20260201 (xfails.toml:12); the version under test is unknown: "
        "bucketing_strategy is stored but not applied."
    )
    _, message, _ = judge([entry()], "a fork", FAILURE)
    assert "; the version under test is unknown ('a fork' is not a PEP 440 version):" in message


def test_one_line_per_entry() -> None:
    older = entry(thunder=["==0.2.1"], source="xfails.toml:40", reason="Older.")
    _, message, props = judge([entry(), older], "0.2.6.dev0", FAILURE)
    notes = [line for line in message.splitlines() if line.startswith("known on")]
    assert notes == [NOTE, "known on ==0.2.1 (xfails.toml:40), not declared for 0.2.6.dev0: Older."]
    assert [k["entry"] for k in json.loads(props[0][1])] == ["xfails.toml:12", "xfails.toml:40"]


def test_the_record_summary_and_comparison_show_it(tmp_path: Path) -> None:
    """The item's user_properties through the report writer: report.json's record carries
    known_elsewhere, summary.md shows the line past the findings it prints, and a comparison
    with a run where the item passed names the versions beside the regression."""
    findings = [
        Failure(
            "collectives.count",
            f"forward all_gathers: expected {n}, got {n + 3} (the count without bucketing)",
            {"phase": "forward", "kind": "all_gather", "got": n + 3, "alternative": "unbucketed"},
            {"expected": n, "unbucketed": n + 3},
        )
        for n in range(14)
    ]
    _, message, props = judge([entry()], "0.2.6.dev0", *findings)
    session = SessionInfo("gloo", 2, "ci", False, ROOT / "xfails.toml", True)
    reporter = Reporter(tmp_path / "report", session)
    for when, outcome, longrepr in (("call", "failed", message), ("teardown", "passed", None)):
        extra = [] if when == "teardown" else [("cell", json.dumps(CELL.id)), ("area", json.dumps(AREA))]
        extra += [("axes", json.dumps(CELL.axes()))] if extra else []
        reporter.pytest_runtest_logreport(
            pytest.TestReport(NODE, ("x", 0, NODE), {}, outcome, longrepr, when, user_properties=[*extra, *props])
        )
    reporter.pytest_sessionfinish(None, 1)  # type: ignore[arg-type]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    [record] = report["cells"]
    assert record["outcome"] == "failed"
    [known] = record["known_elsewhere"]
    assert known["entry"] == "xfails.toml:12" and known["explains"] == [f.message for f in findings]
    assert NOTE.split(":", 1)[0] in record["message"]
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert known["note"] in summary  # the 15th line of the message
    # the headline tells a fork's new failures from upstream's known ones
    assert report["failures"] == {"new": 0, "known_elsewhere": 1}
    assert "1 failed (0 new, 1 known on other Thunder versions)" in summary.split("\n\n")[1]

    old = json.loads(json.dumps(report))
    old["cells"][0] = {**record, "outcome": "passed"}
    del old["cells"][0]["known_elsewhere"]
    comparison = compare(old, report)
    [change] = comparison.items
    assert change.kind == "newly failing" and change.regression
    assert comparison.regressions == 1  # still a regression
    assert change.known_on == "==0.2.6, ==0.2.7.dev20260201"
    text = markdown(comparison)
    assert f"- `{CELL.id}` ({AREA}): passed → failed (known on ==0.2.6, ==0.2.7.dev20260201)" in text


def test_a_newly_failing_item_with_nothing_known_elsewhere_has_no_note() -> None:
    item: dict[str, Any] = {"id": NODE, "cell": CELL.id, "area": AREA, "outcome": "passed"}
    old = {"cells": [item]}
    new = {"cells": [{**item, "outcome": "failed"}]}
    [change] = compare(old, new).items
    assert change.known_on is None and "known on" not in markdown(compare(old, new))

"""Findings carry a stable code and fields, and xfails entries match those, never a message
(issue 55): a message reworded for people changes no outcome, and a message kept while a field
changes is no longer excused. The front end holds every area to account through the ``Area``
protocol alone (its checks, its judgment across ranks and against a baseline): no area is
named there."""

from __future__ import annotations

import ast
import dataclasses
import re
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.checks import collectives, memory
from conformance.checks.findings import CellResult, Failure, Findings
from conformance.checks.registry import AREAS
from conformance.frontend import xfails
from conformance.frontend.verdict import Conformance
from conformance.matrix.cells import Cell
from tests.support.suite_runs import ROOT
from tests.support.verdicts import on_ranks, stand_in_runner

PIN = "0.2.7.dev20260201"
CELL = Cell("tied_lm", "real", "fsdp_jit", bucketing="layer")
REPRO = "repro: python -m pytest conformance/test_collectives.py"


def count_failure(got: int = 6) -> Failure:
    """The forward all-gather count of a LAYER-bucketed cell as collectives records it: the
    model's 3 buckets expected, ``got`` issued (6: one per parameter, the count without them)."""
    found = Findings()
    named = ("unbucketed", "the count without bucketing") if got == 6 else None
    collectives._count(found, "forward", "all_gather", got, 3, named, {"expected": 3, "unbucketed": 6, "zero2": 3})
    [failure] = found.found
    return failure


def pin_entries() -> list[xfails.Expectation]:
    return xfails.load(ROOT / "xfails.toml")


def verdict(failures: list[Failure]) -> type[BaseException] | None:
    """What the verdict of CELL's collectives item raises on ``failures`` (every one on ranks
    0 and 1) under the pin's xfails file: KnownNonConformance, pytest's fail, or None."""
    runner = stand_in_runner(pin_entries(), PIN)
    try:
        Conformance(runner, SimpleNamespace(user_properties=[]))._judge(
            CELL, "collectives", on_ranks(failures), REPRO, False
        )  # type: ignore[arg-type]
    except (pytest.fail.Exception, xfails.KnownNonConformance) as exc:
        return type(exc)
    return None


def test_the_pin_excuses_the_count_by_code_and_fields() -> None:
    failure = count_failure()
    assert (failure.code, failure.fields) == (
        "collectives.count",
        {"phase": "forward", "kind": "all_gather", "got": 6, "alternative": "unbucketed"},
    )
    assert failure.message == "forward all_gathers: expected 3, got 6 (the count without bucketing)"
    assert verdict([failure]) is xfails.KnownNonConformance


@given(st.text(min_size=1, max_size=80).filter(lambda s: s.strip()))
def test_a_reworded_message_changes_no_outcome(message: str) -> None:
    assert verdict([dataclasses.replace(count_failure(), message=message)]) is xfails.KnownNonConformance


def test_the_message_of_an_excused_failure_excuses_nothing() -> None:
    # one more all-gather than without bucketing: no entry's, though it is printed as the excused one
    wrong = count_failure(got=7)
    assert verdict([dataclasses.replace(wrong, message=count_failure().message)]) is pytest.fail.Exception
    # a field the entry does not name is no longer the failure it expects
    extra = dataclasses.replace(count_failure(), fields={**count_failure().fields, "rank": 1})
    assert verdict([extra]) is pytest.fail.Exception


def emitted() -> set[str]:
    """The codes the checks can record: their string constants of the form ``<area>.<name>``,
    and the front end's ``<area>.thunder_raised`` for every area."""
    codes = {f"{a}.thunder_raised" for a in AREAS}
    for path in (ROOT / "conformance" / "checks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value:
                area, _, rest = node.value.partition(".")
                if area in AREAS and rest.isidentifier():
                    codes.add(node.value)
    return codes


def test_the_codes_page_lists_every_code_and_no_other() -> None:
    page = (ROOT / "docs" / "codes.md").read_text()
    rows = set(re.findall(r"^\| `([\w<>]+\.\w+)` \|", page, re.MULTILINE))
    documented = {r for r in rows if not r.startswith("<area>.")} | {
        f"{a}.{r.split('.', 1)[1]}" for r in rows if r.startswith("<area>.") for a in AREAS
    }
    assert sorted(emitted() - documented) == [], "codes without a row in docs/codes.md"
    assert sorted(documented - emitted()) == [], "rows of docs/codes.md for codes no check emits"


def test_every_template_of_the_pin_names_a_code_the_kit_emits() -> None:
    """A template whose code no check can produce would never match (a typo, a renamed code)."""
    by_failures = [e for e in pin_entries() if e.raises is None]  # a raises entry names no code
    written = {t.code for e in by_failures for t in e.templates}
    assert written <= emitted(), sorted(written - emitted())
    assert all(t.code.startswith(f"{e.area}.") for e in by_failures for t in e.templates)


def test_the_front_end_names_no_area() -> None:
    """The front end holds areas to account through ``Area``'s hooks: no string there is an
    area's name or one of its codes, and of the check side it imports only the protocol."""
    allowed = {
        "conformance.checks.registry",
        "conformance.checks.area",
        "conformance.checks.findings",
        "conformance.checks.derived",
        "conformance.checks.declared",
    }
    named = []
    for path in sorted((ROOT / "conformance" / "frontend").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
            if text is not None and (text in AREAS or any(text.startswith(f"{a}.") for a in AREAS)):
                named.append(f"{path.name}:{node.lineno} {text!r}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("conformance.checks"):
                modules = (
                    {node.module}
                    if node.module != "conformance.checks"
                    else {f"conformance.checks.{a.name}" for a in node.names}
                )
                named += [f"{path.name}:{node.lineno} imports {m}" for m in sorted(modules - allowed)]
    assert named == []


class Exact:
    def beyond(self, old: float, new: float) -> bool:
        return new != old

    def describe(self) -> str:
        return "exact"


def test_an_area_judges_its_own_baseline_and_its_ranks() -> None:
    """Memory's baseline and collectives' sequences are those areas' hooks."""
    now = Findings(metrics={"measured": {"forward": 120, "backward": 90}})
    [grown] = memory.AREA.against_baseline({"forward peak": 100, "backward peak": 90}, now, lambda m: Exact())
    assert (grown.code, grown.fields) == ("memory.grown", {"phase": "forward", "before": 100, "measured": 120})
    assert memory.AREA.against_baseline({}, now, lambda m: Exact()) == []  # a cell the baseline did not run
    issued = [Findings(metrics={collectives.SEQUENCE: s}) for s in (["a", "b"], ["a", "b"], ["a", "c"])]
    [across] = collectives.AREA.across_ranks([0, 1, 2], issued)
    assert across.ranks == [2] and across.failure.code == "collectives.sequence"
    assert across.failure.fields == {"at": 1, "got": "c", "first_rank": "b"}
    assert all(a.across_ranks is None for name, a in AREAS.items() if name != "collectives")


def test_the_template_module_refuses_a_free_value() -> None:
    with pytest.raises(ValueError, match="free"):
        xfails.Expectation(
            area="collectives",
            when={},
            failures=[{"code": "collectives.count", "got": "{}"}],
            reason="r",
            link="l",
            thunder=[">=0.2.6"],
        )
    with pytest.raises(ValueError, match="code"):
        xfails.Expectation(
            area="collectives", when={}, failures=["forward all_gathers"], reason="r", link="l", thunder=["==1"]
        )


def test_a_failure_is_read_back_as_the_rank_sent_it() -> None:
    found = Findings()
    found.fail(
        "numerics.distance",
        "output [output] as a whole: nan away",
        {"bound": 1.0},
        name="output",
        distance=float("nan"),
    )
    back = CellResult.from_json(CellResult(areas={"numerics": found}).to_json()).areas["numerics"]
    [failure] = back.found
    assert failure.code == "numerics.distance" and failure.derived == {"bound": 1.0}
    assert back.failures == ["output [output] as a whole: nan away"]

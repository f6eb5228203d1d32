"""An xfails entry excuses exactly the failures it pins: a planted bug that also breaks
something else still fails the item, a count other than the pinned one fails it, one that it
fully explains becomes an xfail, and an entry covering an item that conforms fails that item
as stale. (tests/unit/test_xfails_file.py: templates, versions and bad files, without a world.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.checks.collectives import expected_counts
from conformance.matrix.profiles import cells
from fixtures.models import MODELS
from tests.support.plant_plugin import ENV
from tests.support.suite_runs import run_suite

pytestmark = pytest.mark.slow  # starts worlds or runs the suite in a subprocess

TIED_CELL = next(c.id for c in cells("smoke", 2, {}) if c.model == "tied_lm" and c.tie == "tied")
MLP_CELL = next(c.id for c in cells("smoke", 2, {}) if c.model == "mlp" and c.composition == "fsdp_jit")
PIN = 'thunder = ["==0.2.6", "==0.2.7.dev20260201"]'


def _storages() -> int:
    """The all-gathers the smoke tied cell expects: one per distinct storage of tied_lm."""
    return expected_counts(MODELS["tied_lm"].build(True), "zero2", "none")["forward"]["all_gather"]


def _table(failure: dict[str, str]) -> str:
    """A failure's code and fields as an xfails entry writes them: a TOML inline table."""
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in failure.items()) + " }"


def _xfails(tmp_path: Path, when: str, failures: list[dict[str, str]]) -> Path:
    path = tmp_path / "xfails.toml"
    tables = ", ".join(map(_table, failures))
    path.write_text(
        f"""# a comment, so that the entry is on line 3

[[xfail]]
area = "collectives"
when = {when}
failures = [{tables}]
{PIN}
reason = "planted: a tied weight gathered once per name"
link = "tests/planted/fsdp_transform.py"
"""
    )
    return path


def _count(phase: str, kind: str, more: int) -> dict[str, str]:
    return {"code": "collectives.count", "phase": phase, "kind": kind, "got": f"{{expected+{more}}}"}


def _pinned(more: int) -> list[dict[str, str]]:
    # duplicate_tied_all_gather gathers the tied weight once per name: one more all-gather,
    # one more reduce-scatter, and more bytes (at most world-size times), than there are storages
    moved = "{expected+1..expected_times_world_size}"
    return [
        _count("forward", "all_gather", more),
        _count("backward", "reduce_scatter", more),
        {"code": "collectives.bytes", "phase": "forward", "kind": "all_gather", "got": moved},
        {"code": "collectives.bytes", "phase": "backward", "kind": "reduce_scatter", "got": moved},
    ]


@pytest.mark.parametrize(
    ("failures", "outcome"),
    [
        (lambda n: _pinned(1)[:1], "failed"),  # the reduce-scatters and bytes are not excused
        (lambda n: _pinned(1), "xfailed"),
        (lambda n: _pinned(2), "failed"),  # the counts are not the derived ones: the entry does not hold
    ],
    ids=["partial-entry-still-fails", "exact-entry-xfails", "other-count-fails"],
)
def test_entry_excuses_exactly_what_it_pins(tmp_path, failures, outcome: str) -> None:
    n = _storages()
    xfails = _xfails(tmp_path, '{ model = ["tied_lm"], tie = ["tied"] }', failures(n))
    run = run_suite(
        tmp_path,
        *("--profile", "smoke", "-p", "tests.support.plant_plugin", "--xfails", str(xfails)),
        *("-k", "test_collectives and tied_lm"),
        env={ENV: "duplicate_tied_all_gather"},
    )
    assert run.outcomes("collectives")[TIED_CELL] == outcome, run.output
    assert run.returncode == (1 if outcome == "failed" else 0), run.output
    message = next(c["message"] for c in run.report["cells"] if c["cell"] == TIED_CELL and c["area"] == "collectives")
    assert f"forward all_gathers: expected {n}, got {n + 1}" in message, message
    if outcome == "failed":  # what the entry does not explain is marked as such
        assert any(
            line.strip().startswith("ranks") and not line.endswith("[expected: xfails]")
            for line in message.splitlines()
        ), message


def test_stale_entry_fails_the_item_it_covers(tmp_path) -> None:
    xfails = _xfails(tmp_path, '{ model = ["mlp"] }', [_count("forward", "all_gather", 1)])
    run = run_suite(tmp_path, *("--profile", "smoke", "--xfails", str(xfails), "-k", "test_collectives and mlp"))
    outcomes = run.outcomes("collectives")
    assert outcomes[MLP_CELL] == "failed", run.output
    # a cell the Thunder under test cannot build is not evidence that the entry is stale
    assert all(o in ("failed", "unsupported") for o in outcomes.values()), outcomes
    assert run.returncode == 1, run.output
    message = next(c["message"] for c in run.report["cells"] if c["cell"] == MLP_CELL and c["area"] == "collectives")
    assert f"{xfails}:3: stale" in message and "removed or narrowed" in message, message
    assert "planted: a tied weight gathered once per name" in message, message

"""Every check is shown to fail: a bug planted in Thunder inside the ranks (tests/planted.py)
makes the suite fail on exactly the cells and the check area it should, saying why."""

from __future__ import annotations

import shlex
from collections.abc import Callable

import pytest

from conformance.cells import Cell, matrix
from tests.plant import ENV
from tests.suite import run_suite

ALL: Callable[[Cell], bool] = lambda cell: True  # noqa: E731
NONE: Callable[[Cell], bool] = lambda cell: False  # noqa: E731

# bug -> {area: (must fail, may fail)} and words the failure must contain
EXPECTED = {
    "duplicate_tied_all_gather": (
        {"collectives": (lambda c: c.tie == "tied", NONE), "numerics": (NONE, NONE)},
        "forward all_gathers: expected",
    ),
    "gradients_not_averaged": (
        {"numerics": (ALL, NONE), "collectives": (NONE, NONE)},
        "gradients [",
    ),
    # Module init draws fresh weights, so a permuted shard is invisible there, except that
    # the padding rows Thunder left uninitialized become weights and may be inf or NaN.
    "wrong_shard": (
        {"numerics": (lambda c: c.init == "real", lambda c: c.init != "real"), "collectives": (NONE, NONE)},
        "initial parameters [",
    ),
    "stale_forward_gather": (
        {"numerics": (ALL, NONE), "collectives": (NONE, NONE)},
        "output [output]",
    ),
}


@pytest.mark.parametrize("bug", EXPECTED)
def test_planted_bug_is_caught(bug: str, tmp_path) -> None:
    areas, words = EXPECTED[bug]
    run = run_suite(tmp_path, "-p", "tests.plant", env={ENV: bug})
    assert run.returncode == 1, run.output
    for area, (must, may) in areas.items():
        outcomes = run.outcomes(area)
        for cell in matrix(2):
            got = outcomes[cell.id]
            if must(cell):
                assert got == "failed", f"{bug} not caught by {area} on {cell.id}"
            elif not may(cell):
                assert got == "passed", f"{bug} blamed on {area} of {cell.id}"
    for item in run.report["cells"]:
        must, _ = areas[item["area"]]
        if must(Cell(**item["axes"])):
            assert words in item["message"], item["message"]
        if item["outcome"] == "failed":
            assert f"repro: python -m pytest {shlex.quote(item['id'])} --nproc 2" in item["message"]

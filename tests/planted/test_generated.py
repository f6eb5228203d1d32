"""Generated models catch a planted bug, shrink it to a small model, and print a replay line
that reruns exactly that cell."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.support.plant_plugin import ENV
from tests.support.suite_runs import run_suite

pytestmark = pytest.mark.slow  # starts worlds or runs the suite in a subprocess


def test_planted_bug_shrinks_to_a_replayable_cell(tmp_path) -> None:
    run = run_suite(tmp_path / "bug", "-k", "generated", env={ENV: "gradients_not_averaged"}, plant=True)
    assert run.returncode == 1, run.output
    [message] = [c["message"] for c in run.report["cells"] if c["outcome"] == "failed"]
    assert "does not conform (numerics)" in message and "gradients at step 0 (SGD) [" in message
    replay = next(line for line in message.splitlines() if line.startswith("repro: "))
    args = shlex.split(replay.removeprefix("repro: "))
    cell = json.loads(args[args.index("--replay") + 1])
    # shrunk: one layer, one input and one output feature is the smallest model there is
    assert cell["model"] == "generated" and json.loads(cell["spec"])["widths"] == [1, 1]
    assert cell["offload"] == "none", "shrinking drops the offloading transform too"

    # the printed line reruns that cell alone: failing with the bug, passing without it
    again = run_suite(tmp_path / "again", *args[4:], paths=(args[3],), env={ENV: "gradients_not_averaged"}, plant=True)
    assert again.returncode == 1 and len(again.report["cells"]) == 1, again.output
    clean = run_suite(tmp_path / "clean", *args[4:], paths=(args[3],))
    assert clean.returncode == 0 and len(clean.report["cells"]) == 1, clean.output

"""--baseline: a cell whose measured peak grew beyond run-to-run noise over an earlier report
fails, naming the phase; the same report as baseline passes; the comparison lands in
compare.json and summary.md; an unreadable baseline ends the run in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.frontend import baseline
from tests.support.suite_runs import run_refused

PEAKS = {"setup": 49636, "forward": 2272, "backward": 92628, "step": 11400}


def test_growth_beyond_noise_is_named_per_phase() -> None:
    # CPU peaks repeat to the byte but for the forward's, which gloo's late releases move by up to 960 B
    grown = {**PEAKS, "backward": PEAKS["backward"] + 1, "forward": PEAKS["forward"] + 960}
    assert baseline.grown(PEAKS, grown) == [
        "backward peak grew from 92628 to 92629 bytes over the baseline (run-to-run noise: exact)"
    ]
    assert baseline.grown(PEAKS, {**PEAKS, "forward": PEAKS["forward"] + 1100})[0].startswith("forward peak grew")
    assert baseline.grown(PEAKS, {**PEAKS, "setup": 1}) == []  # shrinking is no failure
    assert baseline.grown(None, PEAKS) == []  # a cell the baseline did not run


def test_an_unreadable_baseline_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(pytest.UsageError, match=r"^--baseline .*missing.json: no such file$"):
        baseline.load(tmp_path / "missing.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(pytest.UsageError, match=r"no report\.json there"):
        baseline.load(tmp_path / "empty")


def test_an_unreadable_baseline_ends_the_run_before_any_world_with_status_4(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    assert run_refused(tmp_path, "--baseline", str(missing)) == f"ERROR: --baseline {missing}: no such file"

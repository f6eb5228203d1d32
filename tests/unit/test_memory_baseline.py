"""--baseline: a cell whose measured peak grew beyond run-to-run noise over an earlier report
fails, naming the phase; the same report as baseline passes; the comparison lands in
compare.json and summary.md; an unreadable baseline ends the run in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conformance.checks import memory
from conformance.checks.findings import Findings
from conformance.frontend import baseline
from conformance.reports.noise import MEMORY
from tests.support.suite_runs import run_refused

PEAKS = {"setup": 49636, "forward": 2272, "backward": 92628, "step": 11400}
CELL = "mlp-real-fsdp_jit"
# what --baseline reads of an earlier report: the cell's memory peaks, each of the memory kind of noise
BEFORE = baseline.Baseline({(CELL, "memory"): {f"{p} peak": (MEMORY, v) for p, v in PEAKS.items()}})


def grown(measured: dict[str, int], cell: str = CELL) -> list[str]:
    """The memory area's failures against BEFORE, for ``cell`` measuring ``measured`` now."""
    found = baseline.judged(memory.AREA, cell, BEFORE, Findings(metrics={"measured": measured}))
    assert all(f.code == "memory.grown" for f in found)
    return [f.message for f in found]


def test_growth_beyond_noise_is_named_per_phase() -> None:
    # CPU peaks repeat to the byte but for the forward's, which gloo's late releases move by up to 960 B
    more = {**PEAKS, "backward": PEAKS["backward"] + 1, "forward": PEAKS["forward"] + 960}
    assert grown(more) == ["backward peak grew from 92628 to 92629 bytes over the baseline (run-to-run noise: exact)"]
    [failure] = baseline.judged(memory.AREA, CELL, BEFORE, Findings(metrics={"measured": more}))
    assert failure.fields == {"phase": "backward", "before": 92628, "measured": 92629}
    assert grown({**PEAKS, "forward": PEAKS["forward"] + 1100})[0].startswith("forward peak grew")
    assert grown({**PEAKS, "setup": 1}) == []  # shrinking is no failure
    assert grown(PEAKS, cell="another-cell") == []  # a cell the baseline did not run
    # an area that does not judge baselines judges none, whatever the baseline holds of it
    unjudged = dataclasses.replace(memory.AREA, against_baseline=None)
    assert baseline.judged(unjudged, CELL, BEFORE, Findings(metrics={"measured": more})) == []


def test_an_unreadable_baseline_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(pytest.UsageError, match=r"^--baseline .*missing.json: no such file$"):
        baseline.load(tmp_path / "missing.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(pytest.UsageError, match=r"no report\.json there"):
        baseline.load(tmp_path / "empty")


def test_an_unreadable_baseline_ends_the_run_before_any_world_with_status_4(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    assert run_refused(tmp_path, "--baseline", str(missing)) == f"ERROR: --baseline {missing}: no such file"

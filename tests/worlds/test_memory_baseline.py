"""--baseline on real runs of the suite: the same report as baseline passes, a cell whose
measured peak grew beyond run-to-run noise fails naming the phase, and the comparison lands
in compare.json and summary.md. (tests/unit/test_memory_baseline.py: the arithmetic and bad
input, without a world.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.suite_runs import run_suite

# The tied_lm cell: its peaks repeat to the byte across runs (the mlp cell's forward peak
# moves by up to 960 B, within the forward's noise threshold but not to the byte).
SELECT = "test_memory and tied_lm"


@pytest.mark.slow  # runs the suite in a subprocess
def test_growth_over_the_baseline_fails(tmp_path: Path) -> None:
    first = run_suite(tmp_path / "first", "--profile", "smoke", "-k", SELECT)
    assert first.returncode == 0, first.output

    again = run_suite(tmp_path / "again", "--profile", "smoke", "-k", SELECT, "--baseline", str(first.report_dir))
    assert again.returncode == 0, again.output
    assert json.loads((again.report_dir / "compare.json").read_text())["regressions"] == 0
    assert "## Runs compared" in again.summary and "**No regression.**" in again.summary

    smaller = json.loads(json.dumps(first.report))
    for item in smaller["cells"]:
        if item.get("area") == "memory" and "measured" in item["metrics"]:
            item["metrics"]["measured"]["backward"] //= 2
    shrunk = tmp_path / "shrunk.json"
    shrunk.write_text(json.dumps(smaller))
    grown = run_suite(tmp_path / "grown", "--profile", "smoke", "-k", SELECT, "--baseline", str(shrunk))
    assert grown.returncode == 1, grown.output
    failed = [c for c in grown.report["cells"] if c["outcome"] == "failed"]
    assert failed and all("backward peak grew from" in c["message"] for c in failed)
    compared = json.loads((grown.report_dir / "compare.json").read_text())
    # timings move too (plain jit compiles where a world first meets its key): only the memory metrics are judged here
    memory = {(m["cell"], m["metric"]) for m in compared["metrics"] if not m["metric"].endswith("_s")}
    assert memory == {(c["cell"], "backward peak") for c in failed}
    assert "### Newly failing" in grown.summary

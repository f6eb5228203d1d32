"""--memory-baseline: a cell whose measured peak grew past the stated margin over an earlier
report fails, naming the phase; the same report as baseline passes."""

from __future__ import annotations

import json

from tests.suite import run_suite


def test_growth_over_the_baseline_fails(tmp_path) -> None:
    first = run_suite(tmp_path / "first", "--profile", "smoke", "-k", "test_memory")
    assert first.returncode == 0, first.output

    same = tmp_path / "same.json"
    same.write_text(json.dumps(first.report))
    again = run_suite(tmp_path / "again", "--profile", "smoke", "-k", "test_memory", "--memory-baseline", str(same))
    assert again.returncode == 0, again.output

    smaller = json.loads(json.dumps(first.report))
    for item in smaller["cells"]:
        if item.get("area") == "memory" and "measured" in item["metrics"]:
            item["metrics"]["measured"]["backward"] //= 2
    shrunk = tmp_path / "shrunk.json"
    shrunk.write_text(json.dumps(smaller))
    grown = run_suite(tmp_path / "grown", "--profile", "smoke", "-k", "test_memory", "--memory-baseline", str(shrunk))
    assert grown.returncode == 1, grown.output
    failed = [c for c in grown.report["cells"] if c["outcome"] == "failed"]
    assert failed and all("backward peak grew from" in c["message"] for c in failed)

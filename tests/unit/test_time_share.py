"""Where a run's time went (conformance/reports/time_share.py)."""

from __future__ import annotations

import pytest

from conformance.reports.time_share import section, time_share


def item(cell: str, area: str, run_s: float, thunder_s: float | None) -> dict:
    timings = {"setup_s": 0.1} if thunder_s is None else {"setup_s": 0.1, "thunder_s": thunder_s}
    return {"cell": cell, "area": area, "metrics": {"cell_run_s": run_s, "timings": timings}}


def test_each_cell_counts_once_and_the_rest_is_the_kits() -> None:
    records = [
        item("a", "numerics", 10.0, 8.0),
        item("a", "memory", 10.0, 8.0),  # the same run, read by another area
        item("b", "numerics", 30.0, 21.0),
        item("simulated", "numerics", 5.0, None),  # no Thunder module timed: left out
        {"cell": "c", "area": "numerics", "metrics": {"world_start_s": 0.0}},  # unsupported: no run
    ]
    share = time_share(records).to_json()
    assert share["cells"] == 2
    assert share["cell_run_s"] == pytest.approx(40.0)
    assert share["thunder_s"] == pytest.approx(29.0)
    assert share["kit_share"] == pytest.approx(11.0 / 40.0)
    assert [h["cell"] for h in share["heaviest"]] == ["b", "a"]
    line = section(share)[0]
    assert "the kit's share 28%" in line and "`b` (9 of 30 s)" in line


def test_nothing_timed_says_nothing() -> None:
    assert section(time_share([]).to_json()) == []
    assert section(None) == []

"""Simulated worlds in the reports: summary.md's "Simulated worlds" table (one row per
simulated cell, one value where the sampled ranks agree, each rank's where they differ) and
scale.png beside it, written at session end by the Reporter; neither without a simulated
cell. No world: the reports are built here in report.json's schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from conformance.checks.storages import distinct_storages
from conformance.matrix.cells import Cell
from conformance.matrix.simulated import sampled_ranks
from conformance.reports.scale import scale_figure
from conformance.reports.session import SessionInfo
from conformance.reports.summary import summary
from conformance.reports.world_sizes import arithmetic
from conformance.reports.writer import Reporter
from fixtures.models import fixture_for
from tests.support.suite_runs import ROOT

SMALL = Cell("pythia_160m", "meta_module_init", "jit_fsdp", tie="tied", sharding="zero3", world_size=8, simulated=True)
LARGE = Cell("llama2_7b_width", "meta_module_init", "fsdp_jit", world_size=1000, simulated=True)
REAL = Cell("tied_lm", "real", "fsdp_jit", tie="tied")
PNG = b"\x89PNG\r\n\x1a\n"


def described(cell: Cell) -> dict[str, Any]:
    """The model as the sharding area's ``model`` metric describes it."""
    with torch.device("meta"):
        module = fixture_for(cell.model).build(cell.tie == "tied")
    return {
        "storages": [
            {"shape": list(p.shape), "element_size": p.element_size()} for p in distinct_storages(module).values()
        ],
        "buffer bytes": sum(b.nbytes for b in module.buffers()),
    }


def item(cell: Cell, area: str, per_rank: dict[int, dict[str, Any]], outcome: str = "passed") -> dict[str, Any]:
    """An item as the writer records it: the first sampled rank's metrics at the top, every
    sampled rank's under "per rank" (a real cell has no "per rank")."""
    ranks = list(per_rank) or [0, 1]
    metrics = {"world_start_s": 0.0, "cell_run_s": 9.0, **per_rank.get(ranks[0], {}), "timings": {"setup_s": 0.1}}
    if cell.simulated:
        metrics["per rank"] = {str(r): m for r, m in per_rank.items()}
    return {
        "id": f"conformance/test_{area}.py::test_{area}[{cell.id}]",
        "outcome": outcome,
        "duration": 0.001,
        "cell": cell.id,
        "area": area,
        "axes": cell.axes(),
        "ranks": [{"rank": i, "status": "passed", "failures": []} for i in range(len(ranks))],
        "metrics": metrics,
    }


def simulated_items(cell: Cell, shard: int, held: int, gathered: int, digests: dict[int, str]) -> list[dict[str, Any]]:
    """The three items of a simulated cell whose sampled ranks agree but for ``digests``."""
    ranks = sampled_ranks(cell.world_size)
    collectives = {
        r: {
            "collective sequence digest": digests.get(r, "cb6724d0db5a08cc"),
            "forward all_gathers": {"expected": 27, "actual": 27},
            "forward all-gathered bytes": {"expected": gathered, "actual": gathered},
        }
        for r in ranks
    }
    memory = {
        r: {
            "measured": {"setup": 3 * held, "alive after setup": held},
            "retained after setup": {"measured": held, "bound": held, "0-d storages": 0},
            "setup peak": {"measured": 3 * held, "bound": 4 * held, "bound / measured": 4 / 3},
        }
        for r in ranks
    }
    sharding = {r: {"shard bytes": {"expected": shard, "actual": shard}, "model": described(cell)} for r in ranks}
    return [
        item(cell, "collectives", collectives, outcome="xfailed"),
        item(cell, "memory", memory),
        item(cell, "sharding", sharding),
    ]


def report(*items: dict[str, Any]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for i in items:
        counts[i["outcome"]] = counts.get(i["outcome"], 0) + 1
    return {
        "environment": {
            "thunder": "0.2.7.dev20260201",
            "thunder_source": {"spec": None, "installed_from": "package index"},
            "torch": "2.11.0",
            "backend": "gloo",
            "world_size": 2,
        },
        "exit_status": 0,
        "wall_s": 60.0,
        "profile": "scale",
        "coverage": {},
        "unmet_pairs": [],
        "counts": counts,
        "cells": list(items),
    }


def real_item() -> dict[str, Any]:
    return item(REAL, "collectives", {0: {"forward all_gathers": {"expected": 6, "actual": 6}}})


def simulated_report() -> dict[str, Any]:
    """The small world as a real run measured it (/tmp/sim1); in the large one rank 999's
    collective sequence and shards differ from the others'."""
    large = simulated_items(LARGE, 26_000_000, 26_300_000, 26_000_000_000, digests={999: "0123456789abcdef"})
    next(i for i in large if i["area"] == "sharding")["metrics"]["per rank"]["999"]["shard bytes"]["actual"] = 0
    small = simulated_items(SMALL, 26_405_376, 26_667_520, 211_243_008, digests={})
    return report(real_item(), *small, *large)


def test_summary_has_a_row_per_simulated_cell() -> None:
    text = summary(simulated_report(), lambda nodeid: nodeid, None, "scale.png")
    section = text[text.index("## Simulated worlds") :]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert [row.split(" | ")[0] for row in rows] == [f"| `{SMALL.id}`", f"| `{LARGE.id}`"]  # the real cell is not one
    small, large = rows
    assert "| 0, 1, 2, 3, 7 | ⚠️ xfail | ✅ | ✅ | 26,405,376 | 27 / 27 | 211,243,008 / 211,243,008 |" in small
    assert "| `cb6724d0db5a08cc` | 26,667,520 / 26,667,520 | 80,002,560 / 106,670,080 |" in small
    assert "| 0, 2, 10, 337, 999 |" in large
    assert "| 0: 26,000,000; 2: 26,000,000; 10: 26,000,000; 337: 26,000,000; 999: 0 |" in large
    assert (
        "| differs: 0: `cb6724d0db5a08cc`; 2: `cb6724d0db5a08cc`; 10: `cb6724d0db5a08cc`; 337: `cb6724d0db5a08cc`; "
        "999: `0123456789abcdef` |"
        in large
    )
    assert "numerics, state dicts, materialization and offloading are not checked there" in section
    assert "[scale.png](scale.png)" in section
    assert "![per-rank memory and all-gathered bytes against world size](scale.png)" in section
    assert "## Simulated worlds" not in summary(report(real_item()), lambda nodeid: nodeid)


def test_the_arithmetic_meets_a_real_simulated_run() -> None:
    """What pythia_160m (tied) held after setup and all-gathered per rank in a world of 8,
    as a simulated run measured them (/tmp/sim1), lies on the figure's line."""
    line = arithmetic(described(SMALL))
    assert line is not None and line.sizes[0] == 4 and line.sizes[-1] == 1024
    at = line.sizes.index(8)
    assert (line.held[at], line.gathered[at]) == (26_667_520, 211_243_008)
    assert arithmetic(None) is None  # a report whose ranks did not describe the model: points alone


def test_scale_png_only_with_simulated_cells(tmp_path: Path) -> None:
    assert scale_figure(simulated_report(), tmp_path / "scale.png")
    assert (tmp_path / "scale.png").read_bytes().startswith(PNG)
    assert not scale_figure(report(real_item()), tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def run_reporter(folder: Path, items: list[dict[str, Any]]) -> str:
    """The Reporter's session end, fed the items of a run by hand; summary.md's text."""
    session = SessionInfo("gloo", 2, "scale", False, ROOT / "xfails.toml", True)
    reporter = Reporter(folder, session)
    for rec in copy.deepcopy(items):
        reporter.records[rec["id"]] = rec
    reporter.pytest_sessionfinish(None, 0)  # type: ignore[arg-type]
    assert json.loads((folder / "report.json").read_text())["cells"]
    return (folder / "summary.md").read_text()


def test_the_reporter_writes_scale_png_beside_summary(tmp_path: Path) -> None:
    text = run_reporter(tmp_path / "sim", simulated_report()["cells"])
    assert (tmp_path / "sim" / "scale.png").read_bytes().startswith(PNG)
    assert "## Simulated worlds" in text and "](scale.png)" in text
    text = run_reporter(tmp_path / "real", [real_item()])
    assert not (tmp_path / "real" / "scale.png").exists()
    assert "Simulated worlds" not in text and "scale.png" not in text

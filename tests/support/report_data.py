"""Reports in report.json's schema for the tests of comparison: two synthetic cells built
here, and a real ci report trimmed to four cells (tests/unit/data/ci_report_excerpt.json),
with the edits a fork's night might make to it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from conformance.compare import main
from conformance.matrix.cells import Cell

TIED_CELL = Cell("tied_lm", "real", "fsdp_jit", tie="tied")
MLP_CELL = Cell(
    "mlp", "meta_module_init", "jit_fsdp", offload="all", sharding="zero3", bucketing="block", dtype="bfloat16"
)
TIED, MLP = TIED_CELL.id, MLP_CELL.id
AXES = {cell.id: cell.axes() for cell in (TIED_CELL, MLP_CELL)}
TIMINGS = {"setup_s": 0.05, "step0_s": 6.0, "step1_s": 0.4, "step2_s": 0.3}


def item(cell: str, area: str, outcome: str = "passed", **metrics: Any) -> dict[str, Any]:
    return {
        "id": f"conformance/test_{area}.py::test_{area}[{cell}]",
        "outcome": outcome,
        "duration": 0.001,
        "cell": cell,
        "area": area,
        "axes": AXES[cell],
        "ranks": [{"rank": r, "status": "passed", "failures": []} for r in range(2)],
        "metrics": {"world_start_s": 0.0, "cell_run_s": 9.0, **metrics, "timings": dict(TIMINGS)},
    }


def memory(cell: str, setup: int, forward: int, backward: int, step: int = 0) -> dict[str, Any]:
    measured = {"setup": setup, "forward": forward, "backward": backward, "step": step}
    return item(cell, "memory", measured=measured, **{f"{p} peak": {"measured": v} for p, v in measured.items()})


def collectives(cell: str, forward_all_gathers: int = 6, gathered: int = 3528) -> dict[str, Any]:
    return item(
        cell,
        "collectives",
        **{
            "forward all_gathers": {"expected": 6, "actual": forward_all_gathers},
            "backward reduce_scatters": {"expected": 6, "actual": 6},
            "forward all-gathered bytes": {"expected": 3528, "actual": gathered},
        },
    )


def report(*items: dict[str, Any], started: str = "2026-11-22T01:00:00+00:00") -> dict[str, Any]:
    counts: dict[str, int] = {}
    for i in items:
        counts[i["outcome"]] = counts.get(i["outcome"], 0) + 1
    return {
        "environment": {"thunder": "0.2.7.dev20260201", "backend": "gloo", "world_size": 2},
        "exit_status": 0,
        "started": started,
        "wall_s": 300.0,
        "profile": "ci",
        "counts": counts,
        "cells": list(items),
    }


def baseline_report() -> dict[str, Any]:
    return report(
        memory(TIED, 49636, 91632, 92628, 11400),
        collectives(TIED),
        item(TIED, "numerics"),
        memory(MLP, 1712, 2272, 4000),
        item(MLP, "offload", **{"held after forward": {"measured": 2000, "estimate": 2000, "bound": 2256}}),
        {"id": "conformance/test_generated.py::test_generated_model_conforms", "outcome": "passed", "duration": 21.0},
    )


def find(rep: dict[str, Any], cell: str, area: str) -> dict[str, Any]:
    return next(i for i in rep["cells"] if i.get("cell") == cell and i.get("area") == area)


def run(tmp_path: Path, old: dict[str, Any], new: dict[str, Any], *extra: str) -> tuple[int, str, dict[str, Any]]:
    """Exit status, Markdown and JSON of comparing two reports written as report folders."""
    for name, rep in (("old", old), ("new", new)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "report.json").write_text(json.dumps(rep))
    out = tmp_path / "compare.md"
    status = main(
        [
            str(tmp_path / "old"),
            str(tmp_path / "new"),
            "--markdown",
            str(out),
            "--json",
            str(tmp_path / "c.json"),
            *extra,
        ]
    )
    return status, out.read_text(), json.loads((tmp_path / "c.json").read_text())


EXCERPT = Path(__file__).parents[1] / "unit" / "data" / "ci_report_excerpt.json"
NEOX = "litgpt_neox-meta_transformed_sd-fsdp_jit-tied-all-zero2-none-float32-torch_only-reshape-ws2"
DDP = "tied_lm-real_broadcast_first-ddp_jit-tied-min_bytes-zero2-none-float32-accumulate-ws2"
LLAMA = "litgpt_llama-real-ddp_jit-tied-largest_fraction-zero2-layer-float32-accumulate-ws2"
NVFUSER = "mlp-real-fsdp_jit-untied-none-zero2-none-float32-nvfuser-ws2"
NEOX_NUMERICS = f"conformance/test_numerics.py::test_numerics[{NEOX}]"
ENTRY = "xfails.toml:12: thunder.distributed.fsdp drops a tied weight's gradient (https://example.org/26)"
NO_EXECUTOR = "the executor 'nvfuser' is not registered in this Thunder"


def ci_report() -> dict[str, Any]:
    return json.loads(EXCERPT.read_text())


def degraded(rep: dict[str, Any]) -> dict[str, Any]:
    """``rep`` overnight on a fork that lost things: one passed item now xfailed under an entry,
    one unsupported (its skip as the report writes it), one cell gone."""
    new = copy.deepcopy(rep)
    xfailed = find(new, NEOX, "numerics")
    xfailed.update(outcome="xfailed", xfail_reason=ENTRY, message=f"{NEOX} does not conform (numerics)")
    unsupported = find(new, DDP, "memory")
    skip = ("conformance/frontend/verdict.py", 79, f"Skipped: unsupported: {NO_EXECUTOR}")
    unsupported.update(outcome="unsupported", message=str(skip))
    new["cells"] = [i for i in new["cells"] if i.get("cell") != LLAMA]
    return new


def compare_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: dict[str, Any], new: dict[str, Any], *extra: str
) -> tuple[int, str]:
    """Exit status and stdout of ``python -m conformance.compare OLD NEW`` (in process)."""
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    status = main([str(tmp_path / "old.json"), str(tmp_path / "new.json"), *extra])
    return status, capsys.readouterr().out

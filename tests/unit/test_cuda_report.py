"""What the reports say of the CUDA path, honest without a GPU: warnings where the run did not
test what its machine suggests (GPUs visible but gloo on CPU; worlds of one rank), none where
it did, and what the runner found handed to the reports (``gpus``: tests/unit/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance.frontend.options import DEFAULT_XFAILS, KitConfig
from conformance.frontend.runner import Runner
from conformance.matrix.cells import Cell
from conformance.reports import environment
from conformance.reports.session import SessionInfo
from conformance.reports.writer import Reporter
from tests.support.fake_gpus import TOO_OLD

# --- what the report says ----------------------------------------------------------------------


def session(backend: str = "gloo", nproc: int = 2, **facts: Any) -> SessionInfo:
    return SessionInfo(backend, nproc, "ci", False, DEFAULT_XFAILS, True, **facts)


def item(cell: Cell) -> dict[str, Any]:
    node = f"conformance/test_numerics.py::test_numerics[{cell.id}]"
    return {"id": node, "cell": cell.id, "area": "numerics", "axes": cell.axes(), "outcome": "passed", "duration": 1.0}


def write(folder: Path, info: SessionInfo, *cells: Cell) -> tuple[dict[str, Any], str]:
    """The Reporter's session end, fed one passing item per cell: report.json, summary.md."""
    reporter = Reporter(folder, info)
    for cell in cells or (Cell("mlp", "real", "fsdp_jit", world_size=info.nproc),):
        reporter.records[item(cell)["id"]] = item(cell)
    reporter.pytest_sessionfinish(None, 0)  # type: ignore[arg-type]
    return json.loads((folder / "report.json").read_text()), (folder / "summary.md").read_text()


WHY = f"torch.cuda.init() raised RuntimeError: {TOO_OLD}"
WARNED = {
    "build-cannot-use": (
        session(requested_backend="auto", gpus_visible=2, cuda_unusable=WHY),
        f"2 GPUs visible, but this torch cannot use them ({WHY}): every rank ran on CPU; "
        "the CUDA and NCCL path was not tested",
    ),
    "gloo-chosen": (
        session(requested_backend="gloo", gpus_visible=8),
        "8 GPUs visible, but --backend gloo was asked for: every rank ran on CPU; "
        "the CUDA and NCCL path was not tested",
    ),
    "too-few-for-auto": (
        session(nproc=4, requested_backend="auto", gpus_visible=6, xdist_workers=2),
        "6 GPUs visible, 3 for each of 2 xdist workers: fewer than the 4 ranks of a world (NCCL needs one each), "
        "so --backend auto chose gloo and every rank ran on CPU; the CUDA and NCCL path was not tested",
    ),
    "nccl-one-rank": (
        session("nccl", 1, requested_backend="nccl", gpus_visible=1),
        "nccl with one rank per world (--nproc 1): sharding is the identity there (each shard is the whole "
        "parameter, collectives move nothing); nothing was sharded",
    ),
}


@pytest.mark.parametrize("case", WARNED)
def test_the_report_says_what_actually_ran(tmp_path: Path, case: str) -> None:
    info, warning = WARNED[case]
    report, text = write(tmp_path, info)
    assert report["warnings"] == [warning]
    env = report["environment"]
    assert (env["requested_backend"], env["gpus_visible"], env["cuda_unusable"], env["xdist_workers"]) == (
        info.requested_backend,
        info.gpus_visible,
        info.cuda_unusable,
        info.xdist_workers,
    )
    # right under the title, above the counts and the table
    assert text.splitlines()[:3] == ["# Thunder distributed conformance", "", f"> ⚠️ **{warning}**"]


def test_one_rank_worlds_name_the_sizes_that_did_shard(tmp_path: Path) -> None:
    cells = [Cell("mlp", "real", "fsdp_jit", world_size=1), Cell("mlp", "real", "fsdp_jit", world_size=3)]
    report, _ = write(tmp_path, session("nccl", 1, requested_backend="nccl", gpus_visible=4), *cells)
    assert report["warnings"] == [
        "nccl with one rank per world (--nproc 1): sharding is the identity there (each shard is the whole "
        "parameter, collectives move nothing); only the cells of world size 3 sharded"
    ]


@pytest.mark.parametrize(
    "info",
    [
        session(),  # a CPU machine: gloo is all there is
        session(requested_backend="gloo"),
        session("nccl", 2, requested_backend="auto", gpus_visible=2),
        session("nccl", 4, requested_backend="nccl", gpus_visible=8, xdist_workers=2),
    ],
)
def test_no_warning_where_the_run_did_what_the_machine_offers(tmp_path: Path, info: SessionInfo) -> None:
    report, text = write(tmp_path, info)
    assert report["warnings"] == [] and "⚠️ **" not in text
    assert environment.warnings(info) == []


def test_the_runner_tells_the_reports_what_it_found(gpus, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Runner.__init__ from the run's options: a driver error makes auto gloo, and the session
    carries what was asked and found (no world is started: cells are picked later)."""
    gpus(2, mask="0,1", error=TOO_OLD)
    info = Runner(KitConfig(cell_timeout=10.0, report_dir=tmp_path), tmp_path).session
    assert (info.backend, info.requested_backend, info.gpus_visible, info.cuda_unusable) == ("gloo", "auto", 2, WHY)
    assert environment.warnings(info) == [WARNED["build-cannot-use"][1]]

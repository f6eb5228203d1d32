"""The CUDA and NCCL path, honest without a GPU: which devices a world gets (the parent's
CUDA_VISIBLE_DEVICES honoured, a disjoint block per xdist worker), what ``--nproc gpus`` means
under xdist, a driver error caught and reported, and the report's warnings where the run did
not test what its machine suggests (GPUs visible but gloo on CPU; worlds of one rank).

No GPU is needed: ``launch.cuda`` is replaced by what tests/support/fake_gpus.py's ``FakeCuda`` makes
``launch.inspect_cuda`` find. The refusals with exit status 4 run in a subprocess in
tests/unit/test_bad_input.py."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from conformance.frontend import options
from conformance.frontend.options import XdistPlace
from conformance.frontend.runner import DEFAULT_XFAILS, Runner
from conformance.matrix.cells import Cell
from conformance.reports import environment
from conformance.reports.session import SessionInfo
from conformance.reports.writer import Reporter
from conformance.world import launch
from tests.support.fake_gpus import TOO_OLD, FakeCuda

UUIDS = "GPU-1b2c3d4e-aaaa-bbbb-cccc-000000000001,GPU-1b2c3d4e-aaaa-bbbb-cccc-000000000002,MIG-5f6e,GPU-77"


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """``gpus(n, mask=..., error=...)``: the pytest process sees ``n`` GPUs through ``mask``
    (None: CUDA_VISIBLE_DEVICES unset) and, with ``error``, a driver too old to use them."""

    def see(n: int, mask: str | None = None, error: str | None = None) -> launch.Cuda:
        if mask is None:
            monkeypatch.delenv(launch.MASK, raising=False)
        else:
            monkeypatch.setenv(launch.MASK, mask)
        found = launch.inspect_cuda(FakeCuda(n, error))
        monkeypatch.setattr(launch, "cuda", lambda: found)
        return found

    return see


# --- device slices ------------------------------------------------------------------------


def test_a_slice_names_the_parents_devices_not_positions_within_them(gpus) -> None:
    gpus(4, mask="4,5,6,7")
    assert launch.device_slice("nccl", 2, slot=0, workers=2) == "4,5"
    assert launch.device_slice("nccl", 2, slot=1, workers=2) == "6,7"
    assert launch.device_slice("nccl", 2, slot=0) == "4,5"  # no xdist: the first two
    assert launch.device_slice("nccl", 4, slot=0) == "4,5,6,7"


def test_uuids_pass_through_in_the_parents_order(gpus) -> None:
    gpus(4, mask=UUIDS)
    first, second, mig, last = UUIDS.split(",")
    assert launch.device_slice("nccl", 2, slot=0, workers=2) == f"{first},{second}"
    assert launch.device_slice("nccl", 2, slot=1, workers=2) == f"{mig},{last}"


def test_only_the_devices_cuda_counts_are_handed_out(gpus) -> None:
    # CUDA stops at the first entry that names no device: " 3" is taken, "99" and after are not
    gpus(2, mask="1, 3,99,0")
    assert launch.visible_device_ids() == ["1", "3"]
    assert launch.device_slice("nccl", 2, slot=0) == "1,3"
    gpus(3)
    assert launch.visible_device_ids() == ["0", "1", "2"]


def test_cpu_worlds_see_no_gpu(gpus) -> None:
    gpus(4, mask="4,5,6,7")
    assert launch.device_slice("gloo", 2, slot=1, workers=2) == launch.HIDDEN  # a CPU world sees no GPU


@pytest.mark.parametrize("visible", range(9))
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_workers_blocks_are_disjoint_for_every_world_size(gpus, visible: int, workers: int) -> None:
    mask = ",".join(f"GPU-{i}" for i in range(visible))
    gpus(visible, mask=mask or None)
    share = launch.gpus_per_worker(workers)
    assert share == visible // workers
    for size in range(1, share + 1):  # the covering array's worlds and the boundary ones alike
        slices = [set(launch.device_slice("nccl", size, slot, workers).split(",")) for slot in range(workers)]
        assert all(len(s) == size and s <= set(mask.split(",")) for s in slices)
        assert sum(map(len, slices)) == len(set().union(*slices)), slices  # no device in two workers
    if share < visible:  # a world larger than the worker's block never starts
        with pytest.raises(RuntimeError, match=rf"a world of {share + 1} ranks in xdist worker 0 of {workers}"):
            launch.device_slice("nccl", share + 1, 0, workers)


def test_auto_is_nccl_only_where_the_workers_block_seats_every_rank(gpus) -> None:
    gpus(3)
    assert launch.resolve_backend("auto", 2) == "nccl"
    assert launch.resolve_backend("auto", 2, workers=2) == "gloo"  # 1 GPU each
    assert launch.resolve_backend("gloo", 2) == "gloo" and launch.resolve_backend("nccl", 9) == "nccl"


# --- --nproc gpus and xdist ------------------------------------------------------------------


def test_nproc_gpus_is_the_workers_share(gpus) -> None:
    gpus(8, mask="0,1,2,3,4,5,6,7")
    assert options._nproc("gpus") == 8
    assert options._nproc("gpus", workers=2) == 4
    assert options._nproc("gpus", workers=3) == 2  # two GPUs left idle
    gpus(2)
    with pytest.raises(pytest.UsageError) as info:
        options._nproc("gpus", workers=3)
    assert str(info.value) == (
        "--nproc gpus: 2 GPUs visible for 3 xdist workers, whose worlds need at least one each: run fewer workers"
    )


def test_nccl_counts_the_workers_share(gpus) -> None:
    gpus(3)
    options._enough_gpus(3)
    with pytest.raises(pytest.UsageError) as info:
        options._enough_gpus(2, workers=2)
    assert str(info.value) == (
        "--backend nccl: --nproc 2 needs 2 GPUs (one per rank), 3 visible, 1 for each of 2 xdist workers"
    )


def _config(workerinput: dict[str, Any] | None = None, **option: Any) -> Any:
    config = types.SimpleNamespace(option=types.SimpleNamespace(**option))
    if workerinput is not None:
        config.workerinput = workerinput
    return config


def test_xdist_place_in_a_worker_and_in_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    assert options.xdist_place(_config({"workerid": "gw2", "workercount": 3})) == XdistPlace(2, 3)
    # the controller counts what it will start; a plain run, even one started from inside an
    # xdist worker (whose variables it inherits), is the only one
    assert options.xdist_place(_config(dist="load", tx=["popen"] * 4)) == XdistPlace(0, 4)
    assert options.xdist_place(_config(dist="loadgroup", tx=["2*popen", "ssh=host"])) == XdistPlace(0, 3)
    assert options.xdist_place(_config(dist="no", tx=[])) == XdistPlace()
    assert options.xdist_place(_config()) == XdistPlace()  # -p no:xdist: no such options


# --- --min-gpus --------------------------------------------------------------------------------


def test_min_gpus(gpus) -> None:
    gpus(1, mask="3")
    assert options._min_gpus(None) is None and options._min_gpus("1") == 1 and options._min_gpus("0") == 0
    with pytest.raises(pytest.UsageError) as info:
        options._min_gpus("2")
    assert str(info.value) == (
        "--min-gpus 2: 1 GPU visible (CUDA_VISIBLE_DEVICES='3'), fewer than 2 (a world of one rank shards nothing); "
        "to run on 1 anyway: --min-gpus 1 (tox -e multigpu -- --min-gpus 1)"
    )
    gpus(3)
    assert options._min_gpus("2") == 2
    with pytest.raises(pytest.UsageError, match=r"3 GPUs visible, 1 for each of 2 xdist workers, fewer than 2"):
        options._min_gpus("2", workers=2)
    for bad in ("two", "-1", "1.5"):
        with pytest.raises(pytest.UsageError, match="--min-gpus must be"):
            options._min_gpus(bad)


# --- a driver error --------------------------------------------------------------------------


def test_a_usable_gpu_is_initialized_once_found() -> None:
    cuda = FakeCuda(2)
    assert launch.inspect_cuda(cuda) == launch.Cuda(2) and cuda.initialized
    assert launch.inspect_cuda(FakeCuda(0)) == launch.Cuda()


def test_a_driver_error_is_caught_and_leaves_no_usable_gpu(gpus) -> None:
    found = gpus(2, error=TOO_OLD)
    assert found == launch.Cuda(2, f"torch.cuda.init() raised RuntimeError: {TOO_OLD}")
    assert launch.visible_cuda_devices() == 0 and launch.resolve_backend("auto", 2) == "gloo"
    with pytest.raises(pytest.UsageError) as info:
        options._enough_gpus(2)
    assert str(info.value) == (
        f"--backend nccl: no GPU is usable: 2 visible, but torch.cuda.init() raised RuntimeError: {TOO_OLD}; "
        "use --backend gloo or auto"
    )


def test_unavailable_devices_say_why_in_torchs_own_words() -> None:
    found = launch.inspect_cuda(FakeCuda(4, TOO_OLD, available=False))
    assert found.devices == 4 and found.usable == 0
    assert found.unusable == (
        f"torch.cuda.is_available() is False: CUDA initialization: {TOO_OLD} (Triggered internally at cuda.cpp:1)"
    )
    assert launch.inspect_cuda(FakeCuda(1, available=False)).unusable == (
        "torch.cuda.is_available() is False: no reason given"
    )


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
    """Runner.__init__ from pytest's options: a driver error makes auto gloo, and the session
    carries what was asked and found (no world is started: cells are picked later)."""
    gpus(2, mask="0,1", error=TOO_OLD)
    given = {
        "nproc": 2,
        "nnodes": 1,
        "rdzv_endpoint": None,
        "xfails": DEFAULT_XFAILS,
        "profile": "ci",
        "backend": "auto",
        "isolate": False,
        "cell_timeout": 10.0,
        "max_idle_worlds": 1,
        "rank_start": "fork",
        "report_dir": tmp_path,
        "baseline": None,
        "thunder_coverage": False,
        "cells": None,
        "affected_by": None,
        "order": "early-verdict",
        "chaos": None,
    }
    config = types.SimpleNamespace(option=types.SimpleNamespace(), getoption=given.__getitem__, rootpath=tmp_path)
    info = Runner(config).session  # type: ignore[arg-type]
    assert (info.backend, info.requested_backend, info.gpus_visible, info.cuda_unusable) == ("gloo", "auto", 2, WHY)
    assert environment.warnings(info) == [WARNED["build-cannot-use"][1]]

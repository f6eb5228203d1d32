"""The CUDA and NCCL path, honest without a GPU: which devices a world gets (the parent's
CUDA_VISIBLE_DEVICES honoured, a disjoint block per xdist worker), what ``--nproc gpus`` means
under xdist, and a driver error caught (what the reports then say: test_cuda_report.py).

No GPU is needed: ``launch.cuda`` is replaced by what tests/support/fake_gpus.py's ``FakeCuda`` makes
``launch.inspect_cuda`` find. The refusals with exit status 4 run in a subprocess in
tests/unit/test_bad_input.py."""

from __future__ import annotations

import types
from typing import Any

import pytest

from conformance.frontend import options
from conformance.frontend.options import XdistPlace
from conformance.world import launch
from tests.support.fake_gpus import TOO_OLD, FakeCuda

UUIDS = "GPU-1b2c3d4e-aaaa-bbbb-cccc-000000000001,GPU-1b2c3d4e-aaaa-bbbb-cccc-000000000002,MIG-5f6e,GPU-77"


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
    assert options.parse_nproc("gpus") == 8
    assert options.parse_nproc("gpus", workers=2) == 4
    assert options.parse_nproc("gpus", workers=3) == 2  # two GPUs left idle
    gpus(2)
    with pytest.raises(pytest.UsageError) as info:
        options.parse_nproc("gpus", workers=3)
    assert str(info.value) == (
        "--nproc gpus: 2 GPUs visible for 3 xdist workers, whose worlds need at least one each: run fewer workers"
    )


def test_nccl_counts_the_workers_share(gpus) -> None:
    gpus(3)
    options.enough_gpus(3)
    with pytest.raises(pytest.UsageError) as info:
        options.enough_gpus(2, workers=2)
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
    assert (
        options.parse_min_gpus(None) is None and options.parse_min_gpus("1") == 1 and options.parse_min_gpus("0") == 0
    )
    with pytest.raises(pytest.UsageError) as info:
        options.parse_min_gpus("2")
    assert str(info.value) == (
        "--min-gpus 2: 1 GPU visible (CUDA_VISIBLE_DEVICES='3'), fewer than 2 (a world of one rank shards nothing); "
        "to run on 1 anyway: --min-gpus 1 (tox -e multigpu -- --min-gpus 1)"
    )
    gpus(3)
    assert options.parse_min_gpus("2") == 2
    with pytest.raises(pytest.UsageError, match=r"3 GPUs visible, 1 for each of 2 xdist workers, fewer than 2"):
        options.parse_min_gpus("2", workers=2)
    for bad in ("two", "-1", "1.5"):
        with pytest.raises(pytest.UsageError, match="--min-gpus must be"):
            options.parse_min_gpus(bad)


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
        options.enough_gpus(2)
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

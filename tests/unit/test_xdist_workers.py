"""``-n auto`` and ``-n N`` alone: as many xdist workers as worlds fit at once (one per
``--nproc`` GPUs or cores), every area of a cell on one worker (loadgroup) unless the command
line picks xdist's mode itself."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from conformance.frontend.options import explicit_dist, workers_that_fit
from conformance.world.launch import visible_cuda_devices
from tests.support.suite_runs import ROOT


@pytest.mark.parametrize(
    ("nproc", "backend", "cores", "gpus", "workers"),
    [
        ("2", "gloo", 2, 0, 1),  # this machine: one world of two ranks fills it
        ("1", "gloo", 2, 0, 2),
        ("2", "auto", 16, 0, 8),  # a 16-core CPU machine
        ("4", "gloo", 3, 0, 1),  # fewer cores than one world: still one worker
        ("2", "auto", 16, 8, 4),  # eight GPUs: four worlds of two
        ("2", "nccl", 16, 8, 4),
        ("gpus", "auto", 16, 8, 1),  # one world over every GPU
        ("3", "nccl", 16, 8, 2),  # the two left over stay idle rather than share
        ("2", "gloo", 16, 8, 8),  # gloo on a GPU machine: the cores count
        ("2", "auto", None, 0, 1),  # os.cpu_count() unknown
    ],
)
def test_auto_fits_as_many_worlds_as_the_machine_holds(nproc, backend, cores, gpus, workers) -> None:
    assert workers_that_fit(nproc, backend, cores, gpus) == workers


def test_an_explicit_mode_is_the_users() -> None:
    assert explicit_dist(["-n", "2", "--dist", "load"]) and explicit_dist(["--dist=each"]) and explicit_dist(["-d"])
    assert not explicit_dist(["-n", "2", "-k", "dist"])


@pytest.mark.slow
def test_auto_asks_the_kit_and_schedules_by_cell() -> None:
    """(An explicit --dist is left alone: explicit_dist above; checked by hand with --dist load.)"""

    def header(*args: str) -> str:
        command = [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", "-v", "-k", "no_such_cell"]
        return subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=300).stdout

    auto = header("-n", "auto", "--nproc", "1")
    expected = workers_that_fit("1", "auto", os.cpu_count(), visible_cuda_devices())
    assert f"created: {expected}/{expected} worker" in auto and "LoadGroupScheduling" in auto


def test_a_message_under_xdist_starts_with_the_verdict_not_the_worker() -> None:
    """The controller's copy of a worker's report prints the worker's line first."""
    from _pytest.reports import TestReport

    from conformance.reports.outcomes import message

    verdict = "cell mlp-... did not run to completion: rank 1 died during backward"
    report = TestReport("conformance/test_numerics.py::test_x", ("f", 1, "x"), {}, "failed", verdict, "call")
    assert message(report) == verdict
    # set by xdist's controller: a worker's gateway, whose line longreprtext then prints first
    report.node = types.SimpleNamespace(
        workerinfo={"id": "gw1", "sysplatform": "linux", "version_info": sys.version_info, "executable": "python"}
    )
    assert report.longreprtext.startswith("[gw1] linux -- Python ")
    assert message(report) == verdict

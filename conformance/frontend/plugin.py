"""The pytest plugin: options, hooks that turn cells into parametrized items, and the
``conformance`` fixture.

Loaded from the repository's conftest.py. Test modules of the suite take two fixtures:
``cell`` (parametrized over the matrix, so each item's id spells the cell's axes) and
``conformance`` (runs the cell on the world once, then asserts one check area of it).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from conformance.checks.registry import applies
from conformance.frontend import baseline
from conformance.frontend.blame import KitError
from conformance.frontend.runner import DEFAULT_XFAILS, RUNNER, Runner
from conformance.frontend.verdict import Conformance
from conformance.frontend.xfails import KnownNonConformance
from conformance.matrix.profiles import PROFILES
from conformance.reports.outcomes import is_unsupported
from conformance.world.launch import visible_cuda_devices

# Hypothesis profiles for generated cells; hypothesis's own --hypothesis-profile picks one.
_QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("dev", max_examples=10, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("ci", max_examples=6, derandomize=True, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("nightly", max_examples=200, deadline=None, suppress_health_check=_QUIET)
settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "Thunder distributed conformance")
    group.addoption(
        "--nproc", type=_nproc, default=2, help="ranks per world (default 2), or 'gpus' for one per visible GPU"
    )
    group.addoption(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="process group backend; auto = nccl when --nproc GPUs are visible, else gloo",
    )
    group.addoption(
        "--cell-timeout", type=float, default=300.0, help="seconds a cell may run before its world is killed"
    )
    group.addoption("--isolate", action="store_true", help="start a fresh world for every cell instead of reusing one")
    group.addoption("--report-dir", type=Path, default=None, help="write report.json, report.jsonl, summary.md here")
    group.addoption(
        "--profile",
        choices=PROFILES,
        default="ci",
        help="which cells: smoke (one per kind of check), ci (pairwise covering array, default), full (every cell)",
    )
    group.addoption(
        "--memory-baseline",
        type=Path,
        default=None,
        metavar="REPORT_JSON",
        help=f"fail a cell whose peak in any phase grew over {baseline.GROWTH:.0%} past this earlier report.json",
    )
    group.addoption(
        "--replay",
        default=None,
        metavar="CELL_JSON",
        help="run one generated cell again, as printed by a failing example of test_generated.py",
    )
    group.addoption(
        "--xfails",
        type=Path,
        default=DEFAULT_XFAILS,
        help="known non-conformances of the Thunder under test (default: the kit's file for its pin)",
    )


def _nproc(value: str) -> int:
    if value == "gpus":
        gpus = visible_cuda_devices()
        if not gpus:
            raise argparse.ArgumentTypeError("--nproc gpus: no GPU is visible")
        return gpus
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("--nproc must be at least 1")
    return n


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cell(id): a conformance cell, run on a torchrun world")
    config.stash[RUNNER] = Runner(config)
    report_dir = config.getoption("report_dir")
    if report_dir is not None and not hasattr(config, "workerinput"):  # xdist workers report to the controller
        from conformance.reports.writer import Reporter

        config.pluginmanager.register(Reporter(report_dir, config.stash[RUNNER].session), "conformance-reporter")


def pytest_unconfigure(config: pytest.Config) -> None:
    runner = config.stash.get(RUNNER, None)
    if runner is not None:
        runner.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" not in metafunc.fixturenames:
        return
    runner = metafunc.config.stash[RUNNER]
    area = metafunc.module.AREA
    params = []
    for cell in runner.cells:
        if not applies(cell, area):
            continue
        # Every area of a cell reads one run: under `--dist loadgroup` they share a worker.
        marks = [pytest.mark.xdist_group(cell.id), pytest.mark.cell(cell.id)]
        known = runner.known(cell, area)
        if known:
            reason = " | ".join(f"{e.source}: {e.reason} ({e.link})" for e in known)
            # strict: a covered item that passes fails (Conformance.expect names the stale entry)
            marks.append(pytest.mark.xfail(reason=reason, raises=KnownNonConformance, strict=True))
        params.append(pytest.param(cell, marks=marks, id=cell.id))
    metafunc.parametrize("cell", params)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # test_replay exists to rerun one printed cell: without --replay there is nothing to run
    if config.getoption("replay") is None:
        replay = [i for i in items if i.name == "test_replay"]
        if replay:
            config.hook.pytest_deselected(items=replay)
            items[:] = [i for i in items if i.name != "test_replay"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    # The kit's own failure is an error of the item, never Thunder's failure: pytest's
    # terminal summary, its exit status and its JUnit writer (<error>) all call a failure
    # outside the call phase an error, so the report says the verdict was never reached.
    if call.when == "call" and call.excinfo is not None and call.excinfo.errisinstance(KitError):
        report.when = "setup"
        report.longrepr = str(call.excinfo.value)  # the message names the frame: no traceback of the kit's verdict
    return report


def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, str] | None:
    if is_unsupported(report):
        return "unsupported", "U", "UNSUPPORTED"
    return None


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> Conformance:
    return Conformance(request.config.stash[RUNNER], request.node)

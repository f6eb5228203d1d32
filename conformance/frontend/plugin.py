"""The pytest plugin: options, hooks that turn cells into parametrized items, and the
``conformance`` fixture.

Loaded from the repository's conftest.py. Test modules of the suite take two fixtures:
``cell`` (parametrized over the matrix, so each item's id spells the cell's axes) and
``conformance`` (runs the cell on the world once, then asserts one check area of it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conformance.checks.registry import applies
from conformance.frontend import baseline, chaos, hypothesis_profiles, options
from conformance.frontend.blame import KitError
from conformance.frontend.ledger import Ledger
from conformance.frontend.probing import RunEnd
from conformance.frontend.runner import DEFAULT_XFAILS, RUNNER, Runner
from conformance.frontend.verdict import Conformance
from conformance.frontend.xfails import KnownNonConformance
from conformance.matrix.order import ORDERS
from conformance.matrix.profiles import PROFILES
from conformance.reports.outcomes import cell_of, is_unsupported
from conformance.world import seal
from conformance.world.launch import visible_cuda_devices
from conformance.world.nodes import join_command

hypothesis_profiles.register()  # before hypothesis's plugin reads --hypothesis-profile


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "Thunder distributed conformance")
    # --nproc, the seconds options and --min-gpus are converted by options.check, so that a bad one is one line
    group.addoption(
        "--nproc", default=2, help="ranks per world (default 2), or 'gpus' for one per usable GPU (per xdist worker)"
    )
    group.addoption(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="process group backend; auto = nccl when --nproc usable GPUs are visible (per xdist worker), else gloo",
    )
    group.addoption(
        "--min-gpus",
        default=None,
        metavar="N",
        help="refuse to start (exit 4) with fewer than N usable GPUs per xdist worker; tox -e multigpu passes 2",
    )
    options.add_node_options(group)
    group.addoption("--cell-timeout", default=300.0, help="seconds a cell may run before its world is killed (> 0)")
    group.addoption("--isolate", action="store_true", help="start a fresh world for every cell instead of reusing one")
    group.addoption(
        "--max-idle-worlds",
        default=1,
        metavar="N",
        help="worlds kept waiting while another runs (default 1; each holds its ranks' memory): beyond N the "
        "least recently used is closed, and without xdist a world no remaining item needs is closed at once",
    )
    group.addoption(
        "--rank-start",
        choices=("fork", "fresh"),
        default="fork",
        help="fork: ranks of gloo and simulated worlds are forked from one process that imported torch and "
        "Thunder once (default); fresh: every rank is a new Python process, as nccl worlds always are",
    )
    group.addoption("--report-dir", type=Path, default=None, help="write report.json, report.jsonl, summary.md here")
    group.addoption(
        "--profile",
        choices=PROFILES,
        default="ci",
        help="which cells: smoke (one per kind of check), ci (pairwise covering array, default), "
        "nightly (every triple of values: a strength-3 covering array), full (every cell), "
        "scale (simulated worlds of 7 to 1024 ranks)",
    )
    group.addoption(
        "--order",
        choices=ORDERS,
        default=ORDERS[0],
        help="early-verdict (default): --baseline's failed cells, a prefix meeting every axis value cheapest "
        "first, then the most new combinations per second; generation: the covering array's, worlds in blocks",
    )
    group.addoption(
        "--baseline",
        type=Path,
        default=None,
        metavar="REPORT",
        help="an earlier report.json (or its folder): a memory item fails where a phase's peak grew beyond "
        "run-to-run noise over it; the whole comparison goes to summary.md and compare.json; a capability lost "
        "over it (an item that passed there is xfailed, unsupported, skipped or gone) makes exit status 1",
    )
    group.addoption("--replay", metavar="CELL_JSON", help="run one generated cell again, as test_generated printed it")
    group.addoption(
        "--cells",
        type=Path,
        default=None,
        metavar="FILE",
        help="run only the profile's cells named in FILE (one id a line, # comments), in that order: "
        "what python -m conformance.mutants hands the suite, cheapest cell first",
    )
    group.addoption(
        "--affected-by",
        default=None,
        metavar="CHANGE",
        help="run only the cells a change to Thunder can reach: a unified diff of Thunder, or PATH:LINES "
        "(thunder/distributed/utils.py:40-42), judged by --coverage-map",
    )
    group.addoption(
        "--coverage-map",
        type=Path,
        default=None,
        metavar="REPORT",
        help="with --affected-by: a --thunder-coverage run's report folder (or its coverage-map.json), made of "
        "the Thunder before the change",
    )
    group.addoption(
        "--first-failing-cell",
        action="store_true",
        help="stop after the first cell with a failing item, once every area of that cell is judged (-x stops "
        "after its first failing area)",
    )
    group.addoption(
        "--thunder-coverage",
        action="store_true",
        help="record which lines of Thunder's distributed stack and materialization each cell runs: "
        "coverage-map.json and coverage's HTML (thunder-coverage/) in --report-dir, read by "
        "`python -m conformance.mutants` (costs time; off by default)",
    )
    group.addoption(
        "--xfails",
        type=Path,
        default=DEFAULT_XFAILS,
        help="known non-conformances of the Thunder under test (default: the kit's file for its pin)",
    )
    chaos.add_options(group)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return options.auto_workers(str(config.option.nproc), config.option.backend, os.cpu_count(), visible_cuda_devices())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cell(id): a conformance cell, run on a torchrun world")
    options.check(config)  # a bad option ends the run here, in one line, before any world starts
    config.stash[RUNNER] = Runner(config)
    config.pluginmanager.register(RunEnd(config.stash[RUNNER]), "conformance-probe-run-end")
    chaos.install(config, config.stash[RUNNER])
    if (nodes := config.stash[RUNNER].nodes) is not None:  # said before collection, which waits for them
        told = None if seal.ENV_TOKEN in os.environ else nodes.seal.token
        agents = f"{nodes.nnodes - 1} join agent{'s' if nodes.nnodes > 2 else ''}"
        sys.stderr.write(f"waiting for {agents}; on each: {join_command(nodes.endpoint, told)}\n")
    if hasattr(config, "workerinput"):  # xdist workers report to the controller
        return
    runner = config.stash[RUNNER]
    whole_run = baseline.selects_all(config) and config.getoption("replay") is None
    ledger = Ledger(runner.expectations, runner.thunder_version, whole_run)
    config.pluginmanager.register(ledger, "conformance-ledger")
    report_dir = config.getoption("report_dir")
    if report_dir is not None:
        from conformance.reports.writer import Reporter

        reporter = Reporter(
            report_dir,
            runner.session,
            baseline=config.getoption("baseline"),
            whole_run=baseline.selects_all(config),
            ledger=ledger,
            run_warnings=runner.run_warnings,
        )
        config.pluginmanager.register(reporter, "conformance-reporter")


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
    # test_replay exists to rerun one printed cell: without --replay there is nothing to run;
    # an area with no cell in the profile (the scale profile's simulated cells judge three
    # areas) has nothing to skip either
    _deselect(
        config,
        items,
        lambda i: (i.name == "test_replay" and config.getoption("replay") is None)
        or any(str(m.kwargs.get("reason", "")).startswith("got empty parameter set") for m in i.iter_markers("skip")),
    )
    runner = config.stash[RUNNER]
    if runner.affected is not None:  # --affected-by: only the cells the change can reach
        cells = {c.id for i in items if (c := cell_of(i)) is not None}
        reached = {c for c in cells if runner.affected.reaches(c)}
        _deselect(config, items, lambda i: (c := cell_of(i)) is not None and c.id not in reached)
        note = runner.affected.note(len(reached), len(cells) - len(reached))
        reporter = config.pluginmanager.get_plugin("conformance-reporter")
        if reporter is not None:
            reporter.affected_by = note
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            kept, out = note["cells_kept"], note["cells_left_out"]
            terminal.write_line(f"--affected-by: {kept} cells run, {out} {note['why']}")
    if runner.asked_order is not None:  # --cells: those cells only, in the file's order
        asked = runner.asked_order
        _deselect(config, items, lambda i: (c := cell_of(i)) is None or c.id not in asked)
    # Verdict first: every area of a cell in a row, so that -x stops right after the first
    # cell with a failing area, in the run's order (conformance/matrix/order.py, which keeps
    # the cells of another world together so that a world is closed once no later item needs it).
    items.sort(key=lambda item: runner.position(cell_of(item)))
    runner.lifetimes.plan((item.nodeid, runner.world_key(cell_of(item))) for item in items)


def _deselect(config: pytest.Config, items: list[pytest.Item], drop: Callable[[pytest.Item], bool]) -> None:
    """Take the items ``drop`` names out of the run, as deselected (pytest counts them so)."""
    dropped = [i for i in items if drop(i)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if not drop(i)]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    item.config.stash[RUNNER].finished(item.nodeid)
    # --first-failing-cell: the cell's run is memoized, so its other areas cost nothing more
    failed = item.stash.get(_FAILED, False) or item.session.stash.get(_CELL_FAILED, False)
    if item.config.getoption("first_failing_cell") and failed:
        item.session.stash[_CELL_FAILED] = True
        if nextitem is None or cell_of(nextitem) != cell_of(item):
            item.session.shouldstop = "--first-failing-cell: every area of the first failing cell is judged"


_FAILED = pytest.StashKey[bool]()
_CELL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    # The kit's own failure is an error of the item, never Thunder's failure: pytest's
    # terminal summary, its exit status and its JUnit writer (<error>) all call a failure
    # outside the call phase an error, so the report says the verdict was never reached.
    # Both read as their message (the kit's error names its frame; an expected non-conformance
    # is its findings, as a failure's message is), never as the kit's frames and their locals.
    if call.when == "call" and call.excinfo is not None and call.excinfo.errisinstance((KitError, KnownNonConformance)):
        if call.excinfo.errisinstance(KitError):
            report.when = "setup"
        report.longrepr = str(call.excinfo.value)
    return report


def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, str] | None:
    if is_unsupported(report):
        return "unsupported", "U", "UNSUPPORTED"
    return None


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> Conformance:
    return Conformance(request.config.stash[RUNNER], request.node)

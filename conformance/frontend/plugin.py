"""The pytest plugin: hooks that turn cells into parametrized items, and the ``conformance``
fixture. The kit's options are registered and parsed in ``options.py``; the hooks read them
from ``config.stash[CONFIG]``.

Loaded from the repository's conftest.py. Test modules of the suite take two fixtures:
``cell`` (parametrized over the matrix, so each item's id spells the cell's axes) and
``conformance`` (runs the cell on the world once, then asserts one check area of it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

import pytest

from conformance.checks.registry import applies
from conformance.frontend import baseline, chaos, hypothesis_profiles
from conformance.frontend.blame import KitError
from conformance.frontend.ledger import Ledger
from conformance.frontend.options import CONFIG, add_options, auto_workers, build
from conformance.frontend.probing import RunEnd
from conformance.frontend.runner import RUNNER, Runner
from conformance.frontend.verdict import Conformance
from conformance.frontend.xfails import KnownNonConformance
from conformance.reports.outcomes import cell_of, is_unsupported
from conformance.world import seal
from conformance.world.nodes import join_command

hypothesis_profiles.register()  # before hypothesis's plugin reads --hypothesis-profile


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return auto_workers(config)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cell(id): a conformance cell, run on a torchrun world")
    kit = config.stash[CONFIG] = build(config)  # a bad option ends the run here, in one line, before any world starts
    runner = config.stash[RUNNER] = Runner(kit, config.rootpath)
    config.pluginmanager.register(RunEnd(runner), "conformance-probe-run-end")
    chaos.install(config, runner)
    if (nodes := runner.nodes) is not None:  # said before collection, which waits for them
        told = None if seal.ENV_TOKEN in os.environ else nodes.seal.token
        agents = f"{nodes.nnodes - 1} join agent{'s' if nodes.nnodes > 2 else ''}"
        sys.stderr.write(f"waiting for {agents}; on each: {join_command(nodes.endpoint, told)}\n")
    if kit.xdist_worker:  # xdist workers report to the controller
        return
    whole_run = baseline.selects_all(config) and kit.replay is None
    ledger = Ledger(runner.expectations, runner.thunder_version, whole_run)
    config.pluginmanager.register(ledger, "conformance-ledger")
    if kit.report_dir is not None:
        from conformance.reports.writer import Reporter

        reporter = Reporter(
            kit.report_dir,
            runner.session,
            baseline=kit.baseline,
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
    kit = config.stash[CONFIG]
    _deselect(
        config,
        items,
        lambda i: (
            (i.name == "test_replay" and kit.replay is None)
            or any(
                str(m.kwargs.get("reason", "")).startswith("got empty parameter set") for m in i.iter_markers("skip")
            )
        ),
    )
    runner = config.stash[RUNNER]
    if (affected := kit.affected_by) is not None:  # --affected-by: only the cells the change can reach
        cells = {c.id for i in items if (c := cell_of(i)) is not None}
        reached = {c for c in cells if affected.reaches(c)}
        _deselect(config, items, lambda i: (c := cell_of(i)) is not None and c.id not in reached)
        note = affected.note(len(reached), len(cells) - len(reached))
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
    runner.lifetimes.plan((item.nodeid, key) for item in items for key in runner.world_keys(cell_of(item)))


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
    if item.config.stash[CONFIG].first_failing_cell and failed:
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

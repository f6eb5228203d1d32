"""The pytest front end: options, one world per controller, cells as parametrized items.

Loaded from the repository's conftest.py. Test modules of the suite take two fixtures:
``cell`` (parametrized over the matrix, so each item's id spells the cell's axes) and
``conformance`` (runs the cell on the world once, then asserts one check area of it).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from conformance import environment, expectations, protocol
from conformance.cells import AREAS, PROFILES, Cell, applies, cells
from conformance.controller import Outcome, World
from conformance.expectations import KnownNonConformance
from conformance.launch import ROOT, LaunchSpec, device_slice, resolve_backend, visible_cuda_devices
from conformance.memory import SLACK_BYTES

# Hypothesis profiles for generated cells; hypothesis's own --hypothesis-profile picks one.
_QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("dev", max_examples=10, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("ci", max_examples=6, derandomize=True, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("nightly", max_examples=200, deadline=None, suppress_health_check=_QUIET)
settings.load_profile("ci")

RUN_CELL = "conformance.execute:run_cell"
BASELINE_GROWTH = 0.10  # a phase's peak may grow this much over --memory-baseline (plus SLACK_BYTES)
DEFAULT_XFAILS = ROOT / "xfails.toml"


def plain_nodeid(nodeid: str) -> str:
    """The id a user can paste: xdist's loadgroup appends ``@<group>``."""
    return nodeid.partition("@")[0]


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
        help=f"fail a cell whose peak in any phase grew over {BASELINE_GROWTH:.0%} past this earlier report.json",
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
        from conformance.report import Reporter

        config.pluginmanager.register(Reporter(report_dir, config.stash[RUNNER]), "conformance-reporter")


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
            reason = " | ".join(f"{e.reason} ({e.link})" for e in known)
            marks.append(pytest.mark.xfail(reason=reason, raises=KnownNonConformance, strict=False))
        params.append(pytest.param(cell, marks=marks, id=cell.id))
    metafunc.parametrize("cell", params)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # test_replay exists to rerun one printed cell: without --replay there is nothing to run
    if config.getoption("replay") is None:
        replay = [i for i in items if i.name == "test_replay"]
        if replay:
            config.hook.pytest_deselected(items=replay)
            items[:] = [i for i in items if i.name != "test_replay"]


def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, str] | None:
    if is_unsupported(report):
        return "unsupported", "U", "UNSUPPORTED"
    return None


def is_unsupported(report: pytest.TestReport) -> bool:
    return (
        report.skipped
        and isinstance(report.longrepr, tuple)
        and report.longrepr[2].removeprefix("Skipped: ").startswith(UNSUPPORTED)
    )


class Runner:
    """The controller's state for one pytest process: its worlds and every cell's outcome."""

    def __init__(self, config: pytest.Config) -> None:
        self.nproc: int = config.getoption("nproc")
        self.backend = resolve_backend(config.getoption("backend"), self.nproc)
        self.cell_timeout: float = config.getoption("cell_timeout")
        self.isolate: bool = config.getoption("isolate")
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
        self.slot = int(worker[2:]) if worker[2:].isdigit() else 0
        self.base_dir = Path(config.getoption("report_dir") or config.rootpath / ".conformance") / "worlds"
        self.profile: str = config.getoption("profile")
        self.cells = cells(self.profile, self.nproc)
        self.baseline = _load_baseline(config.getoption("memory_baseline"))
        self.xfails_file: Path = config.getoption("xfails")
        self.expectations = expectations.load(self.xfails_file)
        self.thunder_version = environment.version(environment.THUNDER_DIST)
        self.worlds: dict[int, World] = {}
        self.outcomes: dict[str, Outcome] = {}
        # what a rank is asked to do for a cell; the kit's own tests swap in planted bugs
        self.cell_task: Callable[[Cell], protocol.Task] = lambda cell: protocol.Task(RUN_CELL, {"axes": cell.axes()})

    def world(self, size: int) -> World:
        if size not in self.worlds:
            spec = LaunchSpec(
                nproc=size, backend=self.backend, cuda_devices=device_slice(self.backend, size, self.slot)
            )
            self.worlds[size] = World(spec, base_dir=self.base_dir)
        return self.worlds[size]

    def run(self, cell: Cell) -> Outcome:
        if cell.id not in self.outcomes:
            world = self.world(cell.world_size)
            self.outcomes[cell.id] = world.run(self.cell_task(cell), self.cell_timeout)
            if self.isolate:
                world.close()
        return self.outcomes[cell.id]

    def known(self, cell: Cell, area: str) -> list[expectations.Expectation]:
        """The xfails entries that cover ``cell`` in ``area`` for the Thunder under test."""
        return [e for e in self.expectations if e.covers(cell, area, self.thunder_version)]

    def grown(self, cell: Cell, measured: dict[str, int]) -> list[str]:
        """Phases whose peak grew past BASELINE_GROWTH over the --memory-baseline report."""
        before = self.baseline.get(cell.id)
        if before is None:
            return []
        return [
            f"{phase} peak grew from {before[phase]} to {now} bytes (more than {BASELINE_GROWTH:.0%} over the baseline)"
            for phase, now in measured.items()
            if phase in before and now > before[phase] * (1 + BASELINE_GROWTH) + SLACK_BYTES
        ]

    def repro(self, nodeid: str) -> str:
        args = ["python", "-m", "pytest", plain_nodeid(nodeid), "--nproc", str(self.nproc), "--backend", self.backend]
        if self.xfails_file != DEFAULT_XFAILS:
            args += ["--xfails", str(self.xfails_file)]
        return shlex.join(args)

    def close(self) -> None:
        for world in self.worlds.values():
            world.close()


RUNNER = pytest.StashKey[Runner]()
UNSUPPORTED = "unsupported: "


class Conformance:
    """Bound to one test item: runs (or reuses) a cell and holds one check area to account."""

    def __init__(self, runner: Runner, node: pytest.Item) -> None:
        self.runner = runner
        self.node = node

    def expect_all(self, cell: Cell) -> None:
        """Every check area that applies to ``cell`` must conform (for generated cells, which
        are not items of their own)."""
        for area in AREAS:
            if applies(cell, area):
                self.expect(cell, area, record=False)

    def replay_line(self, cell: Cell) -> str:
        return shlex.join(
            [
                "python",
                "-m",
                "pytest",
                "conformance/test_generated.py::test_replay",
                "--replay",
                json.dumps(cell.axes()),
            ]
        )

    def expect(self, cell: Cell, area: str, record: bool = True) -> None:
        outcome = self.runner.run(cell)
        if record:
            self._record(cell, area, outcome)
        repro = f"repro: {self.replay_line(cell) if cell.spec else self.runner.repro(self.node.nodeid)}"
        if not outcome.ok:
            pytest.fail(f"cell {cell.id} did not run to completion\n{outcome.describe()}\n{repro}", pytrace=False)
        unsupported = {v["unsupported"] for v in outcome.values if "unsupported" in v}
        if unsupported:
            pytest.skip(UNSUPPORTED + " | ".join(sorted(unsupported)))
        failures = _by_message(
            (rank, msg) for rank, value in enumerate(outcome.values) for msg in value["checks"][area]["failures"]
        )
        if area == "memory":
            for msg in self.runner.grown(cell, outcome.values[0]["checks"][area]["metrics"]["measured"]):
                failures.setdefault(msg, []).append(0)
        if not failures:
            return
        known = self.runner.known(cell, area)
        unexplained = [msg for msg in failures if not any(e.explains(msg) for e in known)]
        lines = [f"{cell.id} does not conform ({area}):"]
        lines += [
            f"  ranks {ranks}: {msg}" + ("" if msg in unexplained else "  [expected: xfails]")
            for msg, ranks in failures.items()
        ]
        message = "\n".join([*lines, repro])
        if unexplained:
            pytest.fail(message, pytrace=False)
        raise KnownNonConformance(message)

    def _record(self, cell: Cell, area: str, outcome: Outcome) -> None:
        ranks = []
        for r in outcome.results:
            entry = {"rank": r.rank, "status": r.status}
            if r.ok and area in r.value.get("checks", {}):
                entry["failures"] = r.value["checks"][area]["failures"]
                entry["status"] = protocol.FAILED if entry["failures"] else protocol.PASSED
            ranks.append(entry)
        metrics: dict[str, object] = {"world_start_s": outcome.startup, "cell_run_s": outcome.duration}
        first = outcome.values[0] if outcome.ok else {}
        if area in first.get("checks", {}):
            metrics.update(first["checks"][area]["metrics"])
            metrics["timings"] = first["timings"]
        props = {"cell": cell.id, "area": area, "axes": cell.axes(), "ranks": ranks, "metrics": metrics}
        self.node.user_properties.extend((k, json.dumps(v)) for k, v in props.items())


def _load_baseline(path: Path | None) -> dict[str, dict[str, int]]:
    if path is None:
        return {}
    cells = json.loads(path.read_text())["cells"]
    return {
        c["cell"]: c["metrics"]["measured"] for c in cells if c.get("area") == "memory" and "measured" in c["metrics"]
    }


def _by_message(pairs: Iterator[tuple[int, str]]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for rank, msg in pairs:
        grouped.setdefault(msg, []).append(rank)
    return grouped


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> Conformance:
    return Conformance(request.config.stash[RUNNER], request.node)

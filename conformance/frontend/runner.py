"""The runner: one per pytest process. It owns the worlds (one per world size, or per cell
under --isolate), runs each cell once and remembers its outcome for every area's item."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.frontend import baseline, xfails
from conformance.matrix.cells import Cell
from conformance.matrix.profiles import cells, coverage
from conformance.reports import environment
from conformance.reports.session import SessionInfo
from conformance.world import protocol
from conformance.world.controller import Outcome, World
from conformance.world.launch import ROOT, LaunchSpec, device_slice, resolve_backend

RUN_CELL = "conformance.rank.entry:run_cell"  # named, never imported: the ranks import it
DEFAULT_XFAILS = ROOT / "xfails.toml"


class Runner:
    """The controller's state for one pytest process: its worlds and every cell's outcome."""

    def __init__(self, config: pytest.Config) -> None:
        nproc: int = config.getoption("nproc")
        xfails_file: Path = config.getoption("xfails")
        profile: str = config.getoption("profile")
        self.cells = cells(profile, nproc)
        # the run's options, kept once: the reports read them too
        self.session = SessionInfo(
            backend=resolve_backend(config.getoption("backend"), nproc),
            nproc=nproc,
            profile=profile,
            isolate=config.getoption("isolate"),
            xfails_file=xfails_file,
            default_xfails=xfails_file == DEFAULT_XFAILS,
            coverage=coverage(self.cells),
        )
        self.cell_timeout: float = config.getoption("cell_timeout")
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
        self.slot = int(worker[2:]) if worker[2:].isdigit() else 0
        self.base_dir = Path(config.getoption("report_dir") or config.rootpath / ".conformance") / "worlds"
        self.baseline = baseline.load(config.getoption("memory_baseline"))
        self.expectations = xfails.load(xfails_file)
        self.thunder_version = environment.version(environment.THUNDER_DIST)
        self.worlds: dict[int, World] = {}
        self.outcomes: dict[str, Outcome] = {}
        # what a rank is asked to do for a cell; the kit's own tests swap in planted bugs
        self.cell_task: Callable[[Cell], protocol.Task] = lambda cell: protocol.Task(RUN_CELL, {"axes": cell.axes()})

    def world(self, size: int) -> World:
        if size not in self.worlds:
            backend = self.session.backend
            spec = LaunchSpec(nproc=size, backend=backend, cuda_devices=device_slice(backend, size, self.slot))
            self.worlds[size] = World(spec, base_dir=self.base_dir)
        return self.worlds[size]

    def run(self, cell: Cell) -> Outcome:
        if cell.id not in self.outcomes:
            world = self.world(cell.world_size)
            self.outcomes[cell.id] = world.run(self.cell_task(cell), self.cell_timeout)
            if self.session.isolate:
                world.close()
        return self.outcomes[cell.id]

    def known(self, cell: Cell, area: str) -> list[xfails.Expectation]:
        """The xfails entries that cover ``cell`` in ``area`` for the Thunder under test."""
        return [e for e in self.expectations if e.covers(cell, area, self.thunder_version)]

    def close(self) -> None:
        for world in self.worlds.values():
            world.close()


RUNNER = pytest.StashKey[Runner]()

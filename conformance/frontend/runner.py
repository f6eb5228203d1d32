"""The runner: one per pytest process. It owns the worlds (one per world size, or per cell
under --isolate), runs each cell once and remembers its outcome for every area's item."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance.checks.findings import CellResult
from conformance.frontend import baseline, probe_cache, xfails
from conformance.frontend.lifetimes import Lifetimes, WorldKey
from conformance.frontend.options import DEFAULT_XFAILS, KitConfig
from conformance.frontend.probing import PROBE, ask
from conformance.matrix import order
from conformance.matrix.cells import Cell
from conformance.matrix.profiles import carries_plain_jit, cells
from conformance.matrix.resharded import worlds_of
from conformance.matrix.simulated import world_of
from conformance.reports import coverage_map, environment
from conformance.reports.session import SessionInfo
from conformance.world import launch, protocol, seal
from conformance.world.controller import World
from conformance.world.launch import ROOT, LaunchSpec
from conformance.world.nodes import Nodes
from conformance.world.outcome import Outcome
from conformance.world.zygote import Zygote

RUN_CELL = "conformance.rank.entry:run_cell"  # named, never imported: the ranks import it
# a resharded resume's saving world's task (conformance/matrix/resharded.py)
SAVE_RESHARDED = "conformance.rank.scenarios.resharded:save"
TRACED = "conformance.rank.thunder_coverage:traced"  # a task run under --thunder-coverage's tracer


# what the rank side imports only inside the functions that use them (Thunder, its
# distributed transforms, litgpt): the zygote imports them once, or every forked rank would
# import them again on its first cell
RANK_IMPORTS = (
    "thunder",
    "thunder.distributed",
    "thunder.distributed.checkpoint",
    "thunder.transforms",
    "thunder.distributed.transforms.fsdp_v2",
    "thunder.distributed.transforms.ddp_v2",
    "thunder.dynamo",
    "thunder.plugins",
    "thunder.recipes",
    "torch.distributed.checkpoint.state_dict",
    "transforms.offload",
    "litgpt",
)


def new_zygote(traced: bool = False) -> Zygote:
    """A zygote (started on first use) that has imported what a rank needs for a cell; with
    ``traced`` (--thunder-coverage) coverage.py too, which a run without it never imports."""
    preload = [
        RUN_CELL.partition(":")[0],
        "conformance.world.rankloop",
        "torch.distributed.run",
        *RANK_IMPORTS,
        *([TRACED.partition(":")[0], "coverage"] if traced else []),
    ]
    # the zygote serves CPU worlds only (never nccl's): it must not initialize the driver
    return Zygote(preload, {**launch.rank_environment(), launch.MASK: launch.HIDDEN}, ROOT)


class Runner:
    """The controller's state for one pytest process: its worlds and every cell's outcome."""

    def __init__(self, config: KitConfig, rootpath: Path) -> None:
        """``config``: the run's options, checked (``options.build``); ``rootpath``: pytest's,
        under which the worlds keep their files when there is no --report-dir."""
        self.config = config
        try:  # an unusable xfails file ends the run before any world starts: exit status 4
            self.expectations = xfails.load(config.xfails)
        except xfails.XfailsError as exc:
            raise pytest.UsageError(str(exc)) from None
        self._cells: list[Cell] | None = None  # picked once the worlds have probed compositions
        self._unsupported: dict[str, str] | None = None
        self.probe_failure: str | None = None  # set where the probe failed twice: the run ends
        self.probe_cached: Path | None = None  # the file the probe's answers came from, if kept
        self.run_warnings: list[str] = []  # said at the top of the run's reports
        self._startup_owed: dict[int, float] = {}  # a world's start not yet charged to a cell
        found = launch.cuda()
        traced = config.report_dir / "thunder-coverage-data" if config.thunder_coverage and config.report_dir else None
        # what the reports are told of the run: plain values (they never import the front end)
        self.session = SessionInfo(
            backend=launch.resolve_backend(config.backend, config.nproc, config.xdist.workers),
            nproc=config.nproc * config.nnodes,  # --nproc counts ranks per machine
            profile=config.profile,
            isolate=config.isolate,
            xfails_file=config.xfails,
            default_xfails=config.xfails == DEFAULT_XFAILS,
            requested_backend=config.backend,
            gpus_visible=found.devices,
            cuda_unusable=found.unusable,
            xdist_workers=config.xdist.workers,
            nnodes=config.nnodes,
            rdzv_endpoint=config.rdzv_endpoint,
            thunder_coverage=traced,
            cells=config.cells,
            chaos=None if config.chaos is None else (config.chaos, config.chaos_share),
        )
        self.nodes: Nodes | None = None  # a run across machines: the other machines' join agents
        if config.nnodes > 1 and (endpoint := config.rdzv_endpoint) is not None:
            token = os.environ.get(seal.ENV_TOKEN) or seal.new_token()
            try:
                silence, rejoin = config.node_silence, config.rejoin_timeout
                self.nodes = Nodes(endpoint, config.nnodes, token, silence=silence, rejoin_timeout=rejoin)
            except RuntimeError as exc:  # c10d: the port is taken, or the host is not this machine's
                raise pytest.UsageError(f"--rdzv-endpoint {endpoint}: cannot listen there: {exc}") from None
        self.base_dir = (config.report_dir or rootpath / ".conformance") / "worlds"
        self.baseline = baseline.load(config.baseline)
        self.thunder_version = environment.version(environment.THUNDER_DIST)
        self.worlds: dict[WorldKey, World] = {}
        # without xdist this process runs every collected item in order, so it knows when a
        # world is needed for the last time; an xdist worker is sent items as it goes
        self.lifetimes = Lifetimes(
            max_idle=config.max_idle_worlds,
            foresight=config.xdist.workers == 1 and not config.xdist_worker,
        )
        self._index: dict[str, int] | None = None  # cell id -> its place in the run
        asked = config.cells  # --cells: these only, in this order
        self.asked_order: dict[str, int] | None = None if asked is None else {c: i for i, c in enumerate(asked)}
        self._retired: list[World] = []  # told to stop, reaped at the end
        self._pooled = False  # the worlds belong to a pool that outlives this session
        self.outcomes: dict[str, Outcome] = {}
        # Ranks forked from a warm process skip importing torch and Thunder. Not under nccl: a
        # fork must precede any CUDA initialisation, which the kit has not verified of
        # Thunder's imports; nor across machines, whose agents start their own ranks.
        forks = config.rank_start == "fork" and self.nodes is None
        self.zygote: Zygote | None = new_zygote(traced is not None) if forks else None
        self._owns_zygote = True
        # what a rank is asked to do to probe the compositions, and for a cell; the kit's own
        # tests swap in faults and planted bugs
        self.probe_task = protocol.Task(PROBE)
        self.cell_task: Callable[[Cell], protocol.Task] = lambda cell: protocol.Task(RUN_CELL, self.cell_payload(cell))
        # a resharded resume's saving world's task (the kit's tests plant bugs in it too)
        self.save_task: Callable[[Cell], protocol.Task] = lambda cell: protocol.Task(
            SAVE_RESHARDED, self.save_payload(cell)
        )

    @property
    def cells(self) -> list[Cell]:
        """The profile's cells over the compositions this Thunder offers: none where the probe
        failed (``probe_failure``; the run then ends: frontend/probing.py)."""
        if self._cells is None:
            unsupported = self.unsupported
            self._cells = [] if self.probe_failure else cells(self.session.profile, self.session.nproc, unsupported)
        return self._cells

    @property
    def unsupported(self) -> dict[str, str]:
        """Composition -> why the Thunder under test does not offer it, as the ranks of a world
        of the session's size find (asked once). A probe that does not complete (a rank died or
        hung at the world's first collective: a flaky NCCL init, say) is asked once more, on a
        fresh world; failing twice, it ends the run, and never passes for support."""
        if self._unsupported is None and self.probe_failure is None:
            # one machine's answers only: another machine's environment is not in the key
            folder = self.config.probe_cache if self.session.nnodes == 1 else None
            key = {} if folder is None else probe_cache.fingerprint(*self._probed_on())
            if folder is not None and (kept := probe_cache.load(folder, key)) is not None:
                self._unsupported, self.probe_cached = kept, probe_cache.path(folder, key)
                return kept

            def run_once() -> Outcome:
                world = self.world(self.session.nproc)
                outcome = world.run(self.traced(self.probe_task, coverage_map.PROBE), self.config.cell_timeout)
                if self.session.isolate:
                    world.close()
                elif outcome.ok:
                    self._startup_owed[self.session.nproc] = outcome.startup
                return outcome

            self._unsupported, self.probe_failure = ask(run_once, self.session.nproc, self.run_warnings)
            if self._unsupported is not None and folder is not None:
                probe_cache.store(folder, key, self._unsupported)
        return self._unsupported or {}

    def _probed_on(self) -> tuple[str, int, list[str]]:
        """What the probe cache's key takes of this session: the backend, the ranks per machine
        and the GPUs the ranks take, by name (none on gloo, whose ranks run on the CPU: then
        torch.cuda is not asked)."""
        backend, nproc = self.session.backend, self.session.nproc
        gpus = launch.visible_cuda_devices() if backend == "nccl" else 0
        if not gpus:
            return backend, nproc, []
        import torch

        return backend, nproc, [torch.cuda.get_device_name(i) for i in range(gpus)]

    def _cell_refusal(self, cell: Cell) -> str | None:
        """Why a real cell cannot run here, or None: a world it needs cannot exist."""
        if cell.saved_at is not None and self.session.nnodes > 1:
            return "a resharded resume's checkpoint folder must be one every rank sees: one machine only"
        saving = None if cell.saved_at is None else self._refusal(cell.saved_at)
        return saving or self._refusal(cell.world_size)

    def _refusal(self, size: int) -> str | None:
        """Why a real world of ``size`` ranks cannot exist here, or None."""
        nnodes = self.session.nnodes
        if nnodes == 1:
            return self._lacks_devices(size)
        if size == self.session.nproc:  # ranks per machine were checked against its GPUs (options)
            return None
        per = self.session.nproc // nnodes
        return f"a world of {size} ranks cannot be laid out on {nnodes} nodes × {per} rank{'s' if per > 1 else ''}"

    def _lacks_devices(self, size: int) -> str | None:
        """Why a world of ``size`` ranks cannot exist here, or None."""
        workers = self.config.xdist.workers
        if self.session.backend != "nccl" or size <= (share := launch.gpus_per_worker(workers)):
            return None
        visible = launch.visible_cuda_devices()
        per_worker = f" ({share} for each of {workers} xdist workers)" if workers > 1 else ""
        return f"a world of {size} ranks needs {size} GPUs under nccl, {visible} are visible{per_worker}"

    def world(self, size: int, simulated: bool = False) -> World:
        """The world of ``size`` processes: real ranks of the session's backend, or (simulated)
        processes that each act as a sampled rank of a cell's world under the fake backend."""
        self.lifetimes.used((size, simulated))
        if (size, simulated) not in self.worlds:
            backend = protocol.NO_GROUP if simulated else self.session.backend
            zygote = self.zygote.path if self.zygote is not None and backend != "nccl" else None
            if simulated:  # on this machine's CPU, as device_slice hides the GPUs from every non-nccl world
                devices = launch.device_slice(backend, size, self.config.xdist.slot, self.config.xdist.workers)
                spec = LaunchSpec(nproc=size, backend=backend, cuda_devices=devices, zygote=zygote)
            else:
                per_node = size // (self.nodes.nnodes if self.nodes else 1)
                devices = launch.device_slice(backend, per_node, self.config.xdist.slot, self.config.xdist.workers)
                spec = LaunchSpec(nproc=per_node, backend=backend, cuda_devices=devices, zygote=zygote)
            nodes = None if simulated else self.nodes  # a simulated world's processes stay on this machine
            self.worlds[size, simulated] = World(spec, base_dir=self.base_dir, nodes=nodes)
        return self.worlds[size, simulated]

    def run(self, cell: Cell) -> Outcome:
        if cell.id not in self.outcomes:
            if not cell.simulated and (why := self._cell_refusal(cell)) is not None:
                # every rank's answer, as a probe that refused the cell would give it
                answer = CellResult(unsupported=why).to_json()
                results = [protocol.RankResult(r, protocol.PASSED, answer) for r in range(cell.world_size)]
                self.outcomes[cell.id] = Outcome(results, duration=0.0, startup=0.0)
                return self.outcomes[cell.id]
            checkpoint = None
            if cell.saved_at is not None:
                checkpoint, saving = self._save_resharded(cell)
                if not saving.ok:  # the saving world's failure is the cell's: nothing to resume from
                    shutil.rmtree(checkpoint, ignore_errors=True)
                    self.outcomes[cell.id] = saving
                    return saving
            world = self.world(*world_of(cell))
            outcome = world.run(self.traced(self.cell_task(cell), cell.id), self.config.cell_timeout)
            if checkpoint is not None:
                shutil.rmtree(checkpoint, ignore_errors=True)
                outcome.duration += saving.duration
                outcome.startup += saving.startup
            # the probe's world start is charged to the first cell the world serves
            if not cell.simulated:
                outcome.startup += self._startup_owed.pop(cell.world_size, 0.0)
            self.outcomes[cell.id] = outcome
            if self.session.isolate:
                world.close()
        return self.outcomes[cell.id]

    def _save_resharded(self, cell: Cell) -> tuple[str, Outcome]:
        """A resharded resume's first part: the cell trained and its checkpoint taken in a
        world of ``saved_at`` ranks, into a folder every rank of this machine sees (a
        resharded cell is refused across machines: ``_refusal``). The folder and that task's
        outcome."""
        directory = self.checkpoint_folder(cell)
        shutil.rmtree(directory, ignore_errors=True)  # an earlier run's, stopped before it was removed
        os.makedirs(directory)
        task = self.save_task(cell)
        world = self.world(cell.saved_at)
        outcome = world.run(self.traced(task, cell.id), self.config.cell_timeout)
        if self.session.isolate:
            world.close()
        return directory, outcome

    def traced(self, task: protocol.Task, context: str) -> protocol.Task:
        """``task`` as the ranks run it: under --thunder-coverage, inside the rank's tracer with
        ``context`` (the cell's id) naming the lines it runs."""
        if self.session.thunder_coverage is None:
            return task
        data_file = str(self.session.thunder_coverage / coverage_map.DATA_NAME)
        kwargs = {"fn": task.fn, "kwargs": task.kwargs, "context": context, "data_file": data_file}
        return protocol.Task(TRACED, {**kwargs, "scope": list(coverage_map.SCOPE)})

    def cell_payload(self, cell: Cell) -> dict[str, Any]:
        """What a rank is handed for ``cell``: its axes, what the xfails file declares of the
        Thunder under test there (conformance/checks/declared.py), and whether the profile
        has it compile plain jit's reference."""
        declared = xfails.declared(self.expectations, cell, self.thunder_version, self.session.backend)
        plain_jit = carries_plain_jit(self.session.profile, cell)
        payload: dict[str, Any] = {"axes": cell.axes(), "declared": declared, "plain_jit": plain_jit}
        if cell.saved_at is not None:
            payload["checkpoint"] = self.checkpoint_folder(cell)
        return payload

    def save_payload(self, cell: Cell) -> dict[str, Any]:
        """What a rank of a resharded resume's saving world is handed: the cell at the size it
        is saved at, and the folder to write into."""
        saving = dataclasses.replace(cell, world_size=cell.saved_at, saved_at=None)
        return {"axes": saving.axes(), "directory": self.checkpoint_folder(cell)}

    def checkpoint_folder(self, cell: Cell) -> str:
        """Where a resharded resume's saving world writes its checkpoint, for the cell's world."""
        return str(self.base_dir / "resharded" / cell.id)

    def known(self, cell: Cell, area: str) -> list[xfails.Expectation]:
        """The xfails entries that cover ``cell`` in ``area`` for the Thunder under test."""
        return [e for e in self.expectations if e.covers(cell, area, self.thunder_version, self.session.backend)]

    # -- worlds' lifetimes -----------------------------------------------------------------

    def world_keys(self, cell: Cell | None) -> list[WorldKey]:
        """Every world an item runs on: a resharded resume's saving world first."""
        return [self.world_key(None)] if cell is None else worlds_of(cell)

    def world_key(self, cell: Cell | None) -> WorldKey:
        """The world an item runs on; ``None``: a generated model, at the session's size."""
        if cell is None:
            return (self.session.nproc, False)
        return world_of(cell)

    def position(self, cell: Cell | None) -> tuple[bool, int, int]:
        """Where an item goes, each cell's areas together: under --cells the file's order; under
        --order generation worlds by size, simulated last; else the early-verdict order.
        Generated models after the session's size's cells (generation) or all (early)."""
        if self.asked_order is not None:
            asked = self.asked_order
            return (False, 0, asked.get(cell.id, len(asked)) if cell is not None else len(asked))
        if self._index is None:
            run = order.arranged(
                self.cells, self.config.order, self.baseline.seconds, self.baseline.first, self.config.sole_carriers
            )
            self._index = {c.id: i for i, c in enumerate(run.cells)}
        if self.config.order == "generation":
            if cell is None:
                return (False, self.session.nproc, len(self._index))
            return (cell.simulated, cell.world_size, self._index.get(cell.id, -1))
        return (False, 0, len(self._index) if cell is None else self._index.get(cell.id, -1))

    def finished(self, nodeid: str) -> None:
        """After an item: retire the worlds ``Lifetimes`` says are no longer worth keeping."""
        for key in self.lifetimes.to_close(nodeid, self.worlds):
            self._retire(key)

    def _retire(self, key: WorldKey) -> None:
        world = self.worlds.pop(key)
        world.retire()
        self._retired.append(world)

    def share_worlds(self, pool: dict[WorldKey, World], zygote: Zygote | None = None) -> None:
        """Run on ``pool``'s worlds (adding to it) and leave them open at the end: the kit's own
        tests run many sessions in one process (tests/support/suite_driver.py), and a world
        start and a cold Thunder cost more than most of their cells. ``zygote``, where given,
        forks the ranks of the worlds this session starts, and outlives it too."""
        self.worlds = pool
        self._pooled = True
        if zygote is not None and self.zygote is not None:
            self.zygote, self._owns_zygote = zygote, False
        self.lifetimes.foresight = False  # the next session may need any of them

    def close(self) -> None:
        for world in [*self._retired, *([] if self._pooled else self.worlds.values())]:
            world.close()
        if self.nodes is not None:
            self.nodes.close()
        if self.zygote is not None and self._owns_zygote:
            self.zygote.close()


RUNNER = pytest.StashKey[Runner]()

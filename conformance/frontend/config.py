"""Every option of the kit in one place: their registration (``add_options``, which the
plugin's ``pytest_addoption`` calls) and ``KitConfig``, the options parsed and checked once
(``build``, first in ``pytest_configure``) and kept in ``config.stash[CONFIG]``. The runner,
the chaos plan, the worlds' lifetimes and the reports read its fields, never pytest's options.

A bad value is a ``pytest.UsageError``: pytest prints it as one ``ERROR:`` line and exits
with status 4 (the checks of each value are in ``options.py``). An ``argparse`` type error
exits 4 too, but pytest prints its usage line, the error and its ini/rootdir lines with it;
so ``--nproc``, the seconds options and the counts are taken as strings and converted in
``build``, where the message can be one line. (``--backend`` and ``--profile`` keep
argparse's choices: its error lists the valid ones.)
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from conformance.frontend import affected, options
from conformance.frontend.affected import Affected
from conformance.frontend.chaos import DEFAULT_SHARE
from conformance.frontend.options import XdistPlace
from conformance.matrix.cells import Cell
from conformance.matrix.order import ORDERS
from conformance.matrix.profiles import PROFILES
from conformance.world.launch import ROOT, visible_cuda_devices
from conformance.world.nodes import REJOIN_TIMEOUT_S, SILENCE_S

DEFAULT_XFAILS = ROOT / "xfails.toml"


@dataclasses.dataclass(frozen=True)
class KitConfig:
    """The run's options, one field per option (named as its ``dest``), parsed and checked;
    the defaults are the options' (``KitConfig()`` is a run given none), plus where this
    process stands among xdist's. The help of each is its option's, in ``add_options``."""

    nproc: int = 2  # ranks per machine, 'gpus' settled into this worker's GPUs
    backend: str = "auto"  # as asked: auto, gloo or nccl (the session's resolves auto)
    min_gpus: int | None = None
    nnodes: int = 1
    rdzv_endpoint: str | None = None  # HOST:PORT, checked, where nnodes > 1
    node_silence: float = SILENCE_S  # seconds
    rejoin_timeout: float = REJOIN_TIMEOUT_S  # seconds
    cell_timeout: float = 300.0  # seconds
    isolate: bool = False
    max_idle_worlds: int = 1
    rank_start: str = "fork"  # fork or fresh
    report_dir: Path | None = None
    profile: str = "ci"
    order: str = ORDERS[0]
    baseline: Path | None = None  # the report's path; the runner loads it
    replay: Cell | None = None  # the cell --replay's JSON names
    cells: tuple[str, ...] | None = None  # --cells FILE's ids, in order, each once
    affected_by: Affected | None = None  # the change, judged by --coverage-map's map
    coverage_map: Path | None = None
    first_failing_cell: bool = False
    thunder_coverage: bool = False
    xfails: Path = DEFAULT_XFAILS
    chaos: int | None = None  # the seed
    chaos_share: float = DEFAULT_SHARE  # in (0, 1] under --chaos
    # xdist's own options, read once: this process's block of the visible GPUs, and whether
    # it is a worker (fed items as it goes) rather than the controller or a plain run
    xdist: XdistPlace = dataclasses.field(default_factory=XdistPlace)
    xdist_worker: bool = False


DEFAULT = KitConfig()  # each option's default, given to argparse in add_options
CONFIG = pytest.StashKey[KitConfig]()


def add_options(parser: pytest.Parser) -> None:
    """Register every option of the kit, in the order ``--help`` lists them."""
    group = parser.getgroup("conformance", "Thunder distributed conformance")
    # --nproc, the seconds options and the counts are converted by build, so that a bad one is one line
    group.addoption(
        "--nproc",
        default=DEFAULT.nproc,
        help="ranks per world (default 2), or 'gpus' for one per usable GPU (per xdist worker)",
    )
    group.addoption(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default=DEFAULT.backend,
        help="process group backend; auto = nccl when --nproc usable GPUs are visible (per xdist worker), else gloo",
    )
    group.addoption(
        "--min-gpus",
        default=DEFAULT.min_gpus,
        metavar="N",
        help="refuse to start (exit 4) with fewer than N usable GPUs per xdist worker; tox -e multigpu passes 2",
    )
    # a run across machines (docs/running.md#worlds-across-machines)
    group.addoption(
        "--nnodes",
        default=DEFAULT.nnodes,
        metavar="N",
        help="machines per world (default 1); above 1 --nproc counts ranks per machine, --rdzv-endpoint is needed, "
        "and each other machine runs `python -m conformance.join HOST:PORT`",
    )
    group.addoption(
        "--rdzv-endpoint",
        default=DEFAULT.rdzv_endpoint,
        metavar="HOST:PORT",
        help="with --nnodes above 1: where this machine listens for the other machines' join agents",
    )
    group.addoption(
        "--node-silence",
        default=DEFAULT.node_silence,
        metavar="SECONDS",
        help=f"with --nnodes above 1: a machine whose join agent's heartbeat stands still this long is lost "
        f"with its ranks (default {SILENCE_S:.0f})",
    )
    group.addoption(
        "--rejoin-timeout",
        default=DEFAULT.rejoin_timeout,
        metavar="SECONDS",
        help=f"with --nnodes above 1: how long the next world waits for a join agent to take a lost machine's "
        f"place (default {REJOIN_TIMEOUT_S:.0f})",
    )
    group.addoption(
        "--cell-timeout",
        default=DEFAULT.cell_timeout,
        help="seconds a cell may run before its world is killed (> 0)",
    )
    group.addoption("--isolate", action="store_true", help="start a fresh world for every cell instead of reusing one")
    group.addoption(
        "--max-idle-worlds",
        default=DEFAULT.max_idle_worlds,
        metavar="N",
        help="worlds kept waiting while another runs (default 1; each holds its ranks' memory): beyond N the "
        "least recently used is closed, and without xdist a world no remaining item needs is closed at once",
    )
    group.addoption(
        "--rank-start",
        choices=("fork", "fresh"),
        default=DEFAULT.rank_start,
        help="fork: ranks of gloo and simulated worlds are forked from one process that imported torch and "
        "Thunder once (default); fresh: every rank is a new Python process, as nccl worlds always are",
    )
    group.addoption(
        "--report-dir",
        type=Path,
        default=DEFAULT.report_dir,
        help="write report.json, report.jsonl, summary.md here",
    )
    group.addoption(
        "--profile",
        choices=PROFILES,
        default=DEFAULT.profile,
        help="which cells: smoke (one per kind of check), ci (pairwise covering array, default), "
        "nightly (every triple of values: a strength-3 covering array), full (every cell), "
        "scale (simulated worlds of 7 to 1024 ranks)",
    )
    group.addoption(
        "--order",
        choices=ORDERS,
        default=DEFAULT.order,
        help="early-verdict (default): --baseline's failed cells, a prefix meeting every axis value cheapest "
        "first, then the most new combinations per second; generation: the covering array's, worlds in blocks",
    )
    group.addoption(
        "--baseline",
        type=Path,
        default=DEFAULT.baseline,
        metavar="REPORT",
        help="an earlier report.json (or its folder): a memory item fails where a phase's peak grew beyond "
        "run-to-run noise over it; the whole comparison goes to summary.md and compare.json; a capability lost "
        "over it (an item that passed there is xfailed, unsupported, skipped or gone) makes exit status 1",
    )
    group.addoption("--replay", metavar="CELL_JSON", help="run one generated cell again, as test_generated printed it")
    group.addoption(
        "--cells",
        type=Path,
        default=DEFAULT.cells,
        metavar="FILE",
        help="run only the profile's cells named in FILE (one id a line, # comments), in that order: "
        "what python -m conformance.mutants hands the suite, cheapest cell first",
    )
    group.addoption(
        "--affected-by",
        default=DEFAULT.affected_by,
        metavar="CHANGE",
        help="run only the cells a change to Thunder can reach: a unified diff of Thunder, or PATH:LINES "
        "(thunder/distributed/utils.py:40-42), judged by --coverage-map",
    )
    group.addoption(
        "--coverage-map",
        type=Path,
        default=DEFAULT.coverage_map,
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
        default=DEFAULT.xfails,
        help="known non-conformances of the Thunder under test (default: the kit's file for its pin)",
    )
    group.addoption(
        "--chaos",
        type=int,
        default=DEFAULT.chaos,
        metavar="SEED",
        help="kill one rank at a seeded phase in a seeded share of the cells (the kit tested on itself): those "
        "cells must name the rank and phase (then xfailed), every other must end as in a clean run",
    )
    group.addoption(
        "--chaos-share",
        type=float,
        default=DEFAULT.chaos_share,
        metavar="FRACTION",
        help=f"with --chaos: the share of cells faulted (default {DEFAULT_SHARE})",
    )


def auto_workers(config: pytest.Config) -> int:
    """``-n auto``'s worker count (``options.auto_workers``). xdist asks before ``pytest_configure``,
    so this reads --nproc and --backend as given, before ``build`` has checked them."""
    nproc, backend = config.getoption("nproc"), config.getoption("backend")
    return options.auto_workers(str(nproc), backend, os.cpu_count(), visible_cuda_devices())


def build(config: pytest.Config) -> KitConfig:
    """The run's options, parsed and checked in this order: a ``pytest.UsageError`` of one
    line for the first bad one. Sets xdist's distribution mode too."""
    # -n alone keeps every area of a cell on one worker (the cell runs once): xdist's
    # loadgroup, unless the command line chose a mode itself
    if getattr(config.option, "dist", "no") == "load" and not options.explicit_dist(config.invocation_params.args):
        config.option.dist = "loadgroup"
    given = config.getoption
    place = options.xdist_place(config)
    nproc = options.nproc(given("nproc"), place.workers)
    cell_timeout = options.seconds(given("cell_timeout"), "--cell-timeout")
    node_silence = options.seconds(given("node_silence"), "--node-silence")
    rejoin_timeout = options.seconds(given("rejoin_timeout"), "--rejoin-timeout")
    max_idle_worlds = options.whole_number(given("max_idle_worlds"), "--max-idle-worlds", 0, "worlds")
    min_gpus = options.min_gpus(given("min_gpus"), place.workers)
    nnodes = options.nodes(given("nnodes"), given("rdzv_endpoint"), place.workers)
    if given("backend") == "nccl":
        options.enough_gpus(nproc, place.workers)
    replay = None if given("replay") is None else options.replay(given("replay"))
    change = given("affected_by")
    affected_by = None if change is None else affected.load(change, given("coverage_map"))
    cells = None if given("cells") is None else tuple(options.cell_list(given("cells")))
    if given("thunder_coverage"):
        options.traced(given("report_dir"), nnodes)
    if given("chaos") is not None and not 0 < given("chaos_share") <= 1:
        raise pytest.UsageError(f"--chaos-share {given('chaos_share')}: a share of the cells, in (0, 1]")
    return KitConfig(
        nproc=nproc,
        backend=given("backend"),
        min_gpus=min_gpus,
        nnodes=nnodes,
        rdzv_endpoint=given("rdzv_endpoint"),
        node_silence=node_silence,
        rejoin_timeout=rejoin_timeout,
        cell_timeout=cell_timeout,
        isolate=given("isolate"),
        max_idle_worlds=max_idle_worlds,
        rank_start=given("rank_start"),
        report_dir=given("report_dir"),
        profile=given("profile"),
        order=given("order"),
        baseline=given("baseline"),
        replay=replay,
        cells=cells,
        affected_by=affected_by,
        coverage_map=given("coverage_map"),
        first_failing_cell=given("first_failing_cell"),
        thunder_coverage=given("thunder_coverage"),
        xfails=given("xfails"),
        chaos=given("chaos"),
        chaos_share=given("chaos_share"),
        xdist=place,
        xdist_worker=hasattr(config, "workerinput"),
    )

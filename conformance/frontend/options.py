"""Every option of the kit, in one module: their registration (``add_options``, which the
plugin's ``pytest_addoption`` calls), the check of each value, and ``KitConfig``, the options
parsed and checked once (``build``, first in ``pytest_configure``) and kept in
``config.stash[CONFIG]``. The runner, the chaos plan, the worlds' lifetimes and the reports
read its fields, never pytest's options. Also where this process stands among xdist's
workers, and ``-n auto``'s count.

A bad value is a ``pytest.UsageError``: pytest prints it as one ``ERROR:`` line and exits
with status 4, before any world starts. An ``argparse`` type error exits 4 too, but pytest
prints its usage line, the error and its ini/rootdir lines with it; so ``--nproc``, the
seconds options and the counts are taken as strings and converted in ``build``, where the
message can be one line. (``--backend`` and ``--profile`` keep argparse's choices: its error
lists the valid ones.)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from conformance.frontend import affected, probe_cache
from conformance.frontend.affected import Affected
from conformance.frontend.chaos import DEFAULT_SHARE
from conformance.matrix.axes import cell_from_axes
from conformance.matrix.cells import Cell
from conformance.matrix.order import ORDERS
from conformance.matrix.profiles import PROFILES
from conformance.world import launch
from conformance.world.launch import ROOT, visible_cuda_devices
from conformance.world.nodes import REJOIN_TIMEOUT_S, SILENCE_S
from conformance.world.protocol import split_endpoint


@dataclasses.dataclass(frozen=True)
class XdistPlace:
    """Where this pytest process stands among xdist's: worker ``slot`` of ``workers`` (0 of 1
    without xdist). The visible GPUs are split into one disjoint block per worker."""

    slot: int = 0
    workers: int = 1


def xdist_place(config: pytest.Config) -> XdistPlace:
    """In a worker xdist says so in PYTEST_XDIST_WORKER(_COUNT); the controller counts the
    workers it will start (``-n N`` is N ``popen`` specs). Whether this is a worker is read from
    the config, never the environment alone: a suite run from inside an xdist worker (the
    kit's own tests) inherits those variables without being one."""
    if hasattr(config, "workerinput"):
        worker = config.workerinput["workerid"]  # type: ignore[attr-defined]
        count = os.environ.get("PYTEST_XDIST_WORKER_COUNT") or config.workerinput["workercount"]  # type: ignore[attr-defined]
        return XdistPlace(int(worker[2:]) if worker[2:].isdigit() else 0, int(count))
    if getattr(config.option, "dist", "no") == "no":
        return XdistPlace()
    return XdistPlace(0, sum(_tx_workers(spec) for spec in getattr(config.option, "tx", None) or []) or 1)


def workers_that_fit(nproc: str, backend: str, cores: int | None, gpus: int) -> int:
    """``-n auto``: as many xdist workers (each its own world) as worlds of ``--nproc`` ranks fit
    at once: one per ``nproc`` usable GPUs where the ranks take GPUs (``gpus``: one world over
    all of them), else one per ``nproc`` cores, as a rank keeps a core busy on the CPU."""
    on_gpus = backend == "nccl" or (backend == "auto" and gpus > 0)
    if nproc == "gpus":
        return 1
    per_world = max(int(nproc), 1) if nproc.isdigit() else 1
    room = gpus if on_gpus else (cores or 1)
    return max(room // per_world, 1)


def explicit_dist(args: Sequence[str]) -> bool:
    """Whether the command line chose xdist's distribution mode itself."""
    return any(a in ("-d", "--dist") or a.startswith("--dist=") for a in args)


def _tx_workers(spec: str) -> int:
    count, star, _ = spec.partition("*")  # "3*popen" is three workers, as xdist expands it
    return int(count) if star and count.isdigit() else 1


def cell_list(path: object) -> list[str]:
    """``--cells FILE``: the cell ids it names, in order, each once."""
    try:
        text = Path(str(path)).read_text()
    except OSError as exc:
        raise pytest.UsageError(f"--cells {path}: {exc.strerror}") from None
    ids = [line.split("#")[0].strip() for line in text.splitlines()]
    ids = list(dict.fromkeys(i for i in ids if i))
    if not ids:
        raise pytest.UsageError(f"--cells {path} names no cell")
    return ids


def traced(report_dir: object, nnodes: int) -> None:
    """--thunder-coverage writes the map beside the report, from the data of ranks that all run
    on this machine (another machine's ranks would save theirs on that machine)."""
    if report_dir is None:
        raise pytest.UsageError("--thunder-coverage writes coverage-map.json into the report: give --report-dir")
    if nnodes > 1:
        raise pytest.UsageError(f"--thunder-coverage reads every rank's data on this machine: not --nnodes {nnodes}")


def _visible() -> str:
    """What restricts the devices, for the message: CUDA_VISIBLE_DEVICES where it is set."""
    value = os.environ.get(launch.MASK)
    return "" if value is None else f" (CUDA_VISIBLE_DEVICES={value!r})"


def _no_gpu() -> str:
    """Why no rank can have a GPU: none visible, or this torch cannot use those that are."""
    found = launch.cuda()
    if found.unusable:
        return f"no GPU is usable{_visible()}: {found.devices} visible, but {found.unusable}"
    return f"no GPU is visible{_visible()}"


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def _share(workers: int) -> str:
    """The per-worker block, for a message, where xdist splits the GPUs."""
    if workers == 1:
        return ""
    return f", {launch.gpus_per_worker(workers)} for each of {workers} xdist workers"


def parse_nproc(value: object, workers: int = 1) -> int:
    # an int already where pytest's default gave it; xdist's workers parse the command line
    # again, so they settle 'gpus' themselves, to the same share as the controller
    if value == "gpus":
        return _one_rank_per_gpu(workers)
    return whole_number(value, "--nproc", 1, "ranks or 'gpus'")


def whole_number(value: object, option: str, least: int, of: str) -> int:
    """``value`` as a whole number of at least ``least``, or one line saying what is wrong."""
    try:
        n = int(value)  # type: ignore[call-overload]
    except ValueError:
        raise pytest.UsageError(f"{option} must be a whole number of {of}, got {value!r}") from None
    if n < least:
        raise pytest.UsageError(f"{option} must be at least {least}, got {n}")
    return n


def _one_rank_per_gpu(workers: int) -> int:
    """``--nproc gpus``: one rank per GPU of this worker's block (all visible without xdist)."""
    if launch.visible_cuda_devices() == 0:
        raise pytest.UsageError(f"--nproc gpus: {_no_gpu()}")
    if (gpus := launch.gpus_per_worker(workers)) == 0:
        raise pytest.UsageError(
            f"--nproc gpus: {_gpus(launch.visible_cuda_devices())} visible{_visible()} for {workers} xdist workers, "
            "whose worlds need at least one each: run fewer workers"
        )
    return gpus


def nodes(value: object, endpoint: str | None, workers: int) -> int:
    """``--nnodes N --rdzv-endpoint HOST:PORT``: N machines per world, their agents joining
    this process at HOST:PORT (which must be this machine's, reachable from theirs)."""
    n = whole_number(value, "--nnodes", 1, "machines")
    if n == 1:
        if endpoint is not None:
            raise pytest.UsageError(f"--rdzv-endpoint {endpoint}: only a run with --nnodes above 1 has join agents")
        return n
    if endpoint is None:
        raise pytest.UsageError(
            f"--nnodes {n} needs --rdzv-endpoint HOST:PORT, an address of this machine the other machines reach"
        )
    try:
        split_endpoint(endpoint)
    except ValueError as exc:
        raise pytest.UsageError(f"--rdzv-endpoint: {exc}") from None
    if workers > 1:  # one set of agents, one endpoint: a run across machines is one pytest process
        raise pytest.UsageError(f"--nnodes {n} runs every world from one pytest process: leave out -n")
    return n


def seconds(value: object, option: str) -> float:
    try:
        n = float(value)  # type: ignore[arg-type]
    except ValueError:
        raise pytest.UsageError(f"{option} must be a number of seconds, got {value!r}") from None
    # zero or less would stop every cell before it starts; NaN would never stop one
    if not (math.isfinite(n) and n > 0):
        raise pytest.UsageError(f"{option} must be a positive number of seconds, got {value!r}")
    return n


def parse_min_gpus(value: object, workers: int = 1) -> int | None:
    """``--min-gpus N`` (tox -e multigpu passes 2): refuse to start with fewer usable GPUs per
    worker, where a world of one rank would pass while splitting nothing."""
    if value is None:
        return None
    n = whole_number(value, "--min-gpus", 0, "GPUs")
    if launch.visible_cuda_devices() == 0 and n > 0:
        raise pytest.UsageError(f"--min-gpus {n}: {_no_gpu()}")
    if (gpus := launch.gpus_per_worker(workers)) < n:
        raise pytest.UsageError(
            f"--min-gpus {n}: {_gpus(launch.visible_cuda_devices())} visible{_visible()}{_share(workers)}, fewer than "
            f"{n} (a world of one rank shards nothing); to run on {gpus} anyway: --min-gpus {gpus} "
            f"(tox -e multigpu -- --min-gpus {gpus})"
        )
    return n


def enough_gpus(nproc: int, workers: int = 1) -> None:
    """NCCL refuses two ranks on one GPU: a world of --nproc ranks needs as many GPUs. (The
    boundary world sizes are checked per cell: a cell too large is reported unsupported.)"""
    if launch.visible_cuda_devices() == 0:
        raise pytest.UsageError(f"--backend nccl: {_no_gpu()}; use --backend gloo or auto")
    if launch.gpus_per_worker(workers) < nproc:
        raise pytest.UsageError(
            f"--backend nccl: --nproc {nproc} needs {nproc} GPUs (one per rank), "
            f"{launch.visible_cuda_devices()} visible{_visible()}{_share(workers)}"
        )


def parse_replay(text: str) -> Cell:
    """The cell a ``--replay`` value names (as a failing generated example prints it)."""
    try:
        axes = json.loads(text)
    except ValueError as exc:
        raise pytest.UsageError(f"--replay is not JSON ({exc}): {text!r}") from None
    try:
        return cell_from_axes(axes)
    except ValueError as exc:
        raise pytest.UsageError(f"--replay: {exc}") from None


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
    # the cells --coverage-map's map says alone ran some line of Thunder: the early verdict's
    # prefix takes them (None: no map; conformance/matrix/order.py)
    sole_carriers: frozenset[str] | None = None
    first_failing_cell: bool = False
    thunder_coverage: bool = False
    xfails: Path = DEFAULT_XFAILS
    chaos: int | None = None  # the seed
    chaos_share: float = DEFAULT_SHARE  # in (0, 1] under --chaos
    # where the composition probe's answers are kept (frontend/probe_cache.py); None: always
    # probe (a KitConfig built by hand; the command line's default is the user's cache)
    probe_cache: Path | None = None
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
        help="worlds kept waiting while another runs (default 1; each holds its ranks' RAM): beyond N the "
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
        help="an earlier report.json (or its folder): an item fails where its area finds the cell grown beyond "
        "run-to-run noise over it (a phase's peak); the whole comparison goes to summary.md and compare.json; "
        "a capability lost over it (an item that passed there is xfailed, unsupported, skipped or gone) makes "
        "exit status 1",
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
        help="a --thunder-coverage run's report folder (or its coverage-map.json): the early verdict runs each "
        "cell that alone ran some line of Thunder in its first part; with --affected-by, made of the Thunder "
        "before the change",
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
        help="record which lines of Thunder's distributed stack and meta-device init each cell runs: "
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
    group.addoption(
        "--probe-cache",
        default=AUTO,
        metavar="DIR",
        help="where the composition probe's answers are kept per Thunder, environment, backend and devices, so "
        "that --collect-only and later runs start no world to ask them ('none': always probe; default: "
        f"${probe_cache.ENV}, else $XDG_CACHE_HOME or ~/.cache, /thunder-conformance)",
    )


AUTO = "auto"  # --probe-cache's default: probe_cache.default_folder()


def parse_probe_cache(given: str) -> Path | None:
    """``--probe-cache``: a folder, ``none`` (off) or ``auto`` (the default folder)."""
    if given == AUTO:
        return probe_cache.default_folder()
    return None if given == probe_cache.OFF else Path(given)


def auto_workers(config: pytest.Config) -> int:
    """``-n auto``'s worker count (``workers_that_fit``). xdist asks before ``pytest_configure``,
    so this reads --nproc and --backend as given, before ``build`` has checked them."""
    nproc, backend = config.getoption("nproc"), config.getoption("backend")
    return workers_that_fit(str(nproc), backend, os.cpu_count(), visible_cuda_devices())


def build(config: pytest.Config) -> KitConfig:
    """The run's options, parsed and checked in this order: a ``pytest.UsageError`` of one
    line for the first bad one. Sets xdist's distribution mode too."""
    # -n alone keeps every area of a cell on one worker (the cell runs once): xdist's
    # loadgroup, unless the command line chose a mode itself
    if getattr(config.option, "dist", "no") == "load" and not explicit_dist(config.invocation_params.args):
        config.option.dist = "loadgroup"
    given = config.getoption
    place = xdist_place(config)
    nproc = parse_nproc(given("nproc"), place.workers)
    cell_timeout = seconds(given("cell_timeout"), "--cell-timeout")
    node_silence = seconds(given("node_silence"), "--node-silence")
    rejoin_timeout = seconds(given("rejoin_timeout"), "--rejoin-timeout")
    max_idle_worlds = whole_number(given("max_idle_worlds"), "--max-idle-worlds", 0, "worlds")
    min_gpus = parse_min_gpus(given("min_gpus"), place.workers)
    nnodes = nodes(given("nnodes"), given("rdzv_endpoint"), place.workers)
    if given("backend") == "nccl":
        enough_gpus(nproc, place.workers)
    replay = None if given("replay") is None else parse_replay(given("replay"))
    change, map_path = given("affected_by"), given("coverage_map")
    cmap = None if map_path is None else affected.read_map(map_path)
    affected_by = None if change is None else affected.load(change, map_path, cmap)
    cells = None if given("cells") is None else tuple(cell_list(given("cells")))
    if given("thunder_coverage"):
        traced(given("report_dir"), nnodes)
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
        coverage_map=map_path,
        sole_carriers=None if cmap is None else cmap.sole_carriers(),
        first_failing_cell=given("first_failing_cell"),
        thunder_coverage=given("thunder_coverage"),
        xfails=given("xfails"),
        chaos=given("chaos"),
        chaos_share=given("chaos_share"),
        probe_cache=parse_probe_cache(given("probe_cache")),
        xdist=place,
        xdist_worker=hasattr(config, "workerinput"),
    )

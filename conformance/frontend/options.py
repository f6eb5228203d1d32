"""The checks of the kit's option values, each a function of the value as given: the number
it settles into, or a ``pytest.UsageError`` of one line (pytest prints it as one ``ERROR:``
line and exits with status 4). ``config.build`` calls them, in ``pytest_configure``, before
any world starts. Also where this process stands among xdist's workers, and ``-n auto``'s count.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from conformance.matrix.axes import cell_from_axes
from conformance.matrix.cells import Cell
from conformance.world import launch
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


def auto_workers(nproc: str, backend: str, cores: int | None, gpus: int) -> int:
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


def nproc(value: object, workers: int = 1) -> int:
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


def min_gpus(value: object, workers: int = 1) -> int | None:
    """``--min-gpus N`` (tox -e multigpu passes 2): refuse to start with fewer usable GPUs per
    worker, where a world of one rank would pass while sharding nothing."""
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


def replay(text: str) -> Cell:
    """The cell a ``--replay`` value names (as a failing generated example prints it)."""
    try:
        axes = json.loads(text)
    except ValueError as exc:
        raise pytest.UsageError(f"--replay is not JSON ({exc}): {text!r}") from None
    try:
        return cell_from_axes(axes)
    except ValueError as exc:
        raise pytest.UsageError(f"--replay: {exc}") from None

"""The options the kit checks itself, in ``pytest_configure``, before any world starts.

A bad value is a ``pytest.UsageError``: pytest prints it as one ``ERROR:`` line and exits
with status 4. An ``argparse`` type error exits 4 too, but pytest prints its usage line, the
error and its ini/rootdir lines with it; so ``--nproc`` and ``--cell-timeout`` are taken as
strings and converted here, where the message can be one line. (``--backend`` and
``--profile`` keep argparse's choices: its error lists the valid ones.)
"""

from __future__ import annotations

import json
import math
import os

import pytest

from conformance.matrix.cells import Cell
from conformance.matrix.profiles import cell_from_axes
from conformance.world import launch


def check(config: pytest.Config) -> None:
    """Raise ``pytest.UsageError`` (one line) for the first bad option; settle ``--nproc``
    (``gpus`` included) and ``--cell-timeout`` into numbers for everything that reads them."""
    config.option.nproc = _nproc(config.option.nproc)
    config.option.cell_timeout = _cell_timeout(config.option.cell_timeout)
    if config.option.backend == "nccl":
        _enough_gpus(config.option.nproc)
    if config.option.replay is not None:
        replay(config.option.replay)


def _visible() -> str:
    """What restricts the devices, for the message: CUDA_VISIBLE_DEVICES where it is set."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if value is None else f" (CUDA_VISIBLE_DEVICES={value!r})"


def _nproc(value: object) -> int:
    # an int already where pytest's default or xdist's controller (which sends its settled
    # options to the workers) gave it
    if value == "gpus":
        if (gpus := launch.visible_cuda_devices()) == 0:
            raise pytest.UsageError(f"--nproc gpus: no GPU is visible{_visible()}")
        return gpus
    try:
        n = int(value)  # type: ignore[call-overload]
    except ValueError:
        raise pytest.UsageError(f"--nproc must be a whole number of ranks or 'gpus', got {value!r}") from None
    if n < 1:
        raise pytest.UsageError(f"--nproc must be at least 1, got {n}")
    return n


def _cell_timeout(value: object) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except ValueError:
        raise pytest.UsageError(f"--cell-timeout must be a number of seconds, got {value!r}") from None
    # zero or less would stop every cell before it starts; NaN would never stop one
    if not (math.isfinite(seconds) and seconds > 0):
        raise pytest.UsageError(f"--cell-timeout must be a positive number of seconds, got {value!r}")
    return seconds


def _enough_gpus(nproc: int) -> None:
    """NCCL refuses two ranks on one GPU: a world of --nproc ranks needs as many GPUs. (The
    boundary world sizes are checked per cell: a cell too large is reported unsupported.)"""
    gpus = launch.visible_cuda_devices()
    if gpus == 0:
        raise pytest.UsageError(f"--backend nccl: no GPU is visible{_visible()}; use --backend gloo or auto")
    if gpus < nproc:
        raise pytest.UsageError(
            f"--backend nccl: --nproc {nproc} needs {nproc} GPUs (one per rank), {gpus} visible{_visible()}"
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

"""One mutant's trial: its file mutated in the overlay, Thunder imported once to see that it
still imports, then the suite run as a user runs it on the cells that execute the mutated
lines (from the coverage map), cheapest first, until the first cell that fails."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from conformance.mutants.kills import INCOMPETENT, KIT_ERROR, NOT_COVERED, RAISED, SILENT, TIMEOUT, Verdict, classify
from conformance.mutants.overlay import Overlay
from conformance.mutants.sites import Mutant
from conformance.reports.coverage_map import CoverageMap
from conformance.world import launch

KIT_ROOT = Path(__file__).resolve().parents[2]  # where `python -m pytest conformance` runs


@dataclasses.dataclass(frozen=True)
class Plan:
    """How every trial of an analysis runs."""

    cmap: CoverageMap
    workdir: Path
    suite_args: tuple[str, ...] = ()  # e.g. ("--nproc", "2", "--cell-timeout", "120")
    timeout: float = 3600.0  # one trial, whatever its cells: a guard against a hung suite


def device(suite_args: tuple[str, ...]) -> str:
    """Where the trials' ranks hold their tensors, "cuda" or "cpu": as the suite resolves its
    backend from ``--backend`` and ``--nproc`` (nccl's ranks are on GPUs, any other's on the CPU)."""
    args = dict(itertools.pairwise(suite_args))
    requested, nproc = args.get("--backend", "auto"), args.get("--nproc", "2")
    if nproc == "gpus":
        return "cuda" if requested in ("auto", "nccl") else "cpu"
    return "cuda" if launch.resolve_backend(requested, int(nproc)) == "nccl" else "cpu"


def cells_for(mutant: Mutant, cmap: CoverageMap) -> list[str]:
    """The cells that run the mutated lines, cheapest first, then those whose lines are
    unknown. A line that only runs at import runs before every cell: every cell, cheapest first
    (a line inside a statement of several counts as its statement), but a function's header
    only matters where the function is called: the cells that ran its body."""
    cells = cmap.cells_running(mutant.path, mutant.lines)
    known = cmap.files.get(mutant.path)
    if not cells and known is not None and {known.statement_of(n) for n in mutant.lines} & set(known.import_time):
        body = known.body_called(mutant.lines)
        if body is not None:
            cells = cmap.cells_running(mutant.path, body)
        else:
            cells = sorted(cmap.cells, key=lambda c: (cmap.cells[c].seconds, c))
    return [*cells, *cmap.unknown] if cells else []


def module_name(path: str) -> str:
    """``thunder/distributed/__init__.py`` -> ``thunder.distributed``."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def diff_of(mutant: Mutant, original: str, mutated: str) -> str:
    return "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True),
            mutated.splitlines(keepends=True),
            fromfile=f"a/{mutant.path}",
            tofile=f"b/{mutant.path}",
            n=1,
        )
    )


def _environment(overlay: Overlay) -> dict[str, str]:
    env = {**os.environ, **overlay.environment()}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the overlay's unmutated modules compile once, not per trial
    return env


def run(mutant: Mutant, overlay: Overlay, plan: Plan, folder: Path) -> tuple[Verdict, str]:
    """The verdict on ``mutant`` and its diff; the suite's report goes to ``folder``."""
    original = (overlay.source / mutant.path).read_text()
    mutated = mutant.mutated(original)
    if mutated is None:
        raise RuntimeError(f"{mutant.id}: the operator finds no such position in this source")
    diff = diff_of(mutant, original, mutated)
    cells = cells_for(mutant, plan.cmap)
    if not cells:
        return Verdict(NOT_COVERED), diff
    start = time.perf_counter()
    env = _environment(overlay)
    with overlay.applied(mutant, mutated):
        imports = subprocess.run(
            [sys.executable, "-c", f"import thunder, {module_name(mutant.path)}"],
            cwd=folder.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if imports.returncode != 0:
            last = (imports.stderr.strip().splitlines() or ["(no output)"])[-1]
            return Verdict(INCOMPETENT, detail=last, seconds=time.perf_counter() - start), diff
        verdict = _judged(cells, folder, env, plan, start)
        if verdict.outcome == SILENT and verdict.cells_run > 1:
            verdict = _confirmed(verdict, folder, env, plan, start)
    return verdict, diff


def _judged(cells: list[str], folder: Path, env: dict[str, str], plan: Plan, start: float) -> Verdict:
    """The suite on ``cells`` (the mutant applied), up to the first failing cell, classified."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "cells.txt").write_text("".join(f"{c}\n" for c in cells))
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "conformance",
        "-p",
        "no:cacheprovider",
        "-q",
        "--first-failing-cell",
        "--cells",
        str(folder / "cells.txt"),
        "--report-dir",
        str(folder),
        *plan.suite_args,
    ]
    with (folder / "output.txt").open("w") as out:
        try:
            run_suite(argv, env, out, plan.timeout)
        except subprocess.TimeoutExpired:
            return Verdict(TIMEOUT, detail=f"the suite ran past {plan.timeout:.0f} s")
    seconds = time.perf_counter() - start
    shutil.rmtree(folder / "worlds", ignore_errors=True)  # rank logs: the report keeps what matters
    report_file = folder / "report.json"
    if not report_file.exists():  # the pytest process never imports Thunder: no report is the kit's failure
        tail = (folder / "output.txt").read_text(errors="replace").strip().splitlines()[-3:]
        return Verdict(KIT_ERROR, detail="no report: " + " | ".join(tail), seconds=seconds)
    return classify(json.loads(report_file.read_text()), seconds)


def _confirmed(killed: Verdict, folder: Path, env: dict[str, str], plan: Plan, start: float) -> Verdict:
    """A silent kill after other cells must recur on its cell run alone: a finding that needs
    the cells before it in the same process is the kit's state leaking across cells (a cache
    keyed on too little) or a flake, not what the mutant computes. Not recurring, the trial is
    the kit's failure, named, and judged again after the kit is fixed (``--rejudge``)."""
    alone = _judged([killed.cell], folder / "alone", env, plan, start)
    if alone.outcome == SILENT:
        return dataclasses.replace(killed, seconds=alone.seconds)
    if alone.outcome == RAISED:  # a kill still: alone, Thunder raises where it ran on before
        return dataclasses.replace(alone, cells_run=killed.cells_run)
    return dataclasses.replace(
        killed,
        outcome=KIT_ERROR,
        detail=f"killed at {killed.cell} after {killed.cells_run - 1} other cells, but on that cell alone "
        f"{alone.outcome}: {killed.detail}",
        seconds=alone.seconds,
    )


def run_suite(argv: list[str], env: dict[str, str], out: IO[str], timeout: float, grace: float = 60.0) -> int:
    """The suite's exit status. Stopped from outside (the analysis interrupted, or past its
    time), the suite is sent SIGTERM first, so that it stops its worlds as a user's Ctrl-C
    would, and killed only if it outlives ``grace``."""
    with subprocess.Popen(argv, cwd=KIT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT) as suite:
        try:
            return suite.wait(timeout=timeout)
        except BaseException:
            suite.terminate()
            try:
                suite.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                suite.kill()
            raise

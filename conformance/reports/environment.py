"""Which stack ran: versions, and where the Thunder under test came from.

Read from package metadata, so the controller never has to import Thunder.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from conformance.reports.session import SessionInfo

THUNDER_DIST = "lightning-thunder"
THUNDER_SPEC_ENV = "THUNDER_SPEC"


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache  # where Thunder lives does not change within a process
def thunder_package() -> Path | None:
    """The folder of the ``thunder`` package this interpreter would import (found, not
    imported: the controller stays light), or None where there is none."""
    try:
        spec = importlib.util.find_spec("thunder")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def thunder_source() -> dict[str, Any]:
    """The requested spec (THUNDER_SPEC, else the kit's pin) and what pip recorded installing."""
    source: dict[str, Any] = {"spec": os.environ.get(THUNDER_SPEC_ENV) or None, "installed_from": "package index"}
    try:
        raw = importlib.metadata.distribution(THUNDER_DIST).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return {**source, "installed_from": None}
    if raw:  # PEP 610: present for installs from a URL, a VCS or a local path
        direct = json.loads(raw)
        source["installed_from"] = direct.get("url")
        if "vcs_info" in direct:
            source["commit"] = direct["vcs_info"].get("commit_id")
        if direct.get("dir_info", {}).get("editable"):
            source["editable"] = True
    return source


def nvfuser() -> str | None:
    """The installed nvFuser wheel, as ``name==version`` (its name carries the CUDA and torch
    it was built for: nvfuser-cu130-torch210), or None."""
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().replace("_", "-").startswith("nvfuser"):
            return f"{name}=={dist.version}"
    return None


def describe(session: SessionInfo) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "torch": version("torch"),
        "thunder": version(THUNDER_DIST),
        "thunder_source": thunder_source(),
        "litgpt": version("litgpt"),
        # Thunder's default executors include nvFuser where it imports: the executors axis's
        # ``default`` cells then run it (its ``nvfuser`` cells say whether it was usable)
        "nvfuser": nvfuser(),
        "backend": session.backend,
        "requested_backend": session.requested_backend,
        "world_size": session.nproc,
        "gpus_visible": session.gpus_visible,
        "cuda_unusable": session.cuda_unusable,
        "xdist_workers": session.xdist_workers,
        "kit": kit_checkout(),
        **({"nodes": session.nnodes} if session.nnodes > 1 else {}),  # a run across machines
    }


def kit_checkout() -> dict[str, Any]:
    """The kit's own commit, and whether its checkout differs from it: which kit wrote a report
    matters as much as which Thunder it judged. Null where the kit is not a git checkout."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "modified": bool(status) if status is not None else None}


# What a run that passes did not test, said where a reader of the report cannot miss it: a
# green run on CPU or on one rank per world reads like a green run on GPUs otherwise.
UNTESTED = "the CUDA and NCCL path was not tested"


def warnings(session: SessionInfo, world_sizes: Iterable[int] = ()) -> list[str]:
    """One line per way the run differs from what its environment suggests; ``world_sizes``:
    those of the real (not simulated) cells that ran."""
    found = [_cpu_despite_gpus(session), _one_rank_worlds(session, set(world_sizes))]
    return [w for w in found if w is not None]


def _cpu_despite_gpus(session: SessionInfo) -> str | None:
    """GPUs are visible, yet every rank ran gloo on CPU: which of the three reasons."""
    n = session.gpus_visible
    if session.backend != "gloo" or n == 0:
        return None
    gpus = f"{n} GPU{'' if n == 1 else 's'} visible"
    if session.cuda_unusable:
        return f"{gpus}, but this torch cannot use them ({session.cuda_unusable}): every rank ran on CPU; {UNTESTED}"
    if session.requested_backend == "gloo":
        return f"{gpus}, but --backend gloo was asked for: every rank ran on CPU; {UNTESTED}"
    workers = session.xdist_workers
    share = f", {n // workers} for each of {workers} xdist workers" if workers > 1 else ""
    return (
        f"{gpus}{share}: fewer than the {session.nproc} ranks of a world (NCCL needs one each), so --backend auto "
        f"chose gloo and every rank ran on CPU; {UNTESTED}"
    )


def _one_rank_worlds(session: SessionInfo, world_sizes: set[int]) -> str | None:
    """A world of one rank holds every parameter whole: its shards, gathers and reductions are
    the identity, so a pass there says nothing of sharding."""
    if session.nproc != 1:
        return None
    others = sorted(world_sizes - {1})
    sharded = f"only the cells of world size {', '.join(map(str, others))} sharded" if others else "nothing was sharded"
    return (
        f"{session.backend} with one rank per world (--nproc 1): sharding is the identity there (each shard is the "
        f"whole parameter, collectives move nothing); {sharded}"
    )

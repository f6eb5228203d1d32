"""The composition probe's answers kept between runs, so that listing the cells
(``--collect-only``, a ``-k`` dry run) and every run after the first start no world to ask
what the Thunder under test offers.

An answer is kept per fingerprint of everything that can change it: the Thunder under test
(its version, where it is installed and every file of its package by size and modification
time, so that a local checkout edited in place is probed again), every installed
distribution and its version (torch, nvFuser, litgpt: a probe asks for modules and wheels),
the environment variables a probe reads (PATH, CC and CXX: where it finds a compiler), the
Python, the kit's own probes (their sources), the process group backend, the ranks per
machine and the GPUs visible, by name. Any of them changed, the key differs and the probe runs
again; a probe that did not complete is never kept. A run across machines always probes
(another machine's environment is not in this one's fingerprint).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any

from conformance.reports import environment
from conformance.world.launch import ROOT

ENV = "CONFORMANCE_PROBE_CACHE"  # a folder, or "none"; overrides the user's cache folder
OFF = "none"
# the kit's sources a probe's answer depends on: the registries that name each probe, the
# probes themselves and the rank side that asks them
PROBE_SOURCES = ("fixtures", "transforms", "conformance/rank/probe.py")
# the environment a probe reads beside the installed packages: where it looks for a program
# (torch.compile's probe asks for a compiler: on CUDA a C one, CC, else gcc or clang on PATH;
# on the CPU a C++ one, CXX, else g++ or clang++)
PROBE_ENVIRONMENT = ("PATH", "CC", "CXX")


def default_folder() -> Path | None:
    """``--probe-cache``'s default: $CONFORMANCE_PROBE_CACHE (``none``: off), else the user's
    cache folder ($XDG_CACHE_HOME or ~/.cache) / thunder-conformance."""
    chosen = os.environ.get(ENV)
    if chosen:
        return None if chosen == OFF else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "thunder-conformance"


def fingerprint(backend: str, nproc: int, devices: list[str]) -> dict[str, Any]:
    """What the probe's answers depend on, as JSON (see the module's docstring); ``devices``:
    the GPUs the ranks take, by name (none on gloo, whose ranks run on the CPU)."""
    thunder = environment.thunder_package()
    return {
        "thunder": {
            "version": environment.version(environment.THUNDER_DIST),
            "package": str(thunder) if thunder is not None else None,
            "files": _digest(_stats(thunder)) if thunder is not None else None,
        },
        "distributions": _digest(
            sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
        ),
        "python": platform.python_version(),
        "environment": {name: os.environ.get(name) for name in PROBE_ENVIRONMENT},
        "kit": _digest(_contents(ROOT / p for p in PROBE_SOURCES)),
        "backend": backend,
        "nproc": nproc,
        "devices": {"gpus": devices, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")},
    }


def path(folder: Path, key: dict[str, Any]) -> Path:
    return folder / "probes" / f"{_digest([json.dumps(key, sort_keys=True)])}.json"


def load(folder: Path | None, key: dict[str, Any]) -> dict[str, str] | None:
    """The answers kept for ``key`` (composition -> why unsupported), or None: no folder, none
    kept, or a file that cannot be read as one (probed again and written anew)."""
    if folder is None:
        return None
    try:
        kept = json.loads(path(folder, key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key or not isinstance(kept.get("unsupported"), dict):
        return None
    return {str(k): str(v) for k, v in kept["unsupported"].items()}


def store(folder: Path | None, key: dict[str, Any], unsupported: dict[str, str]) -> None:
    """Keep the answers of a probe that completed; a folder that cannot be written keeps
    nothing (the next run probes again), never failing the run."""
    if folder is None:
        return
    target = path(folder, key)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"key": key, "unsupported": unsupported}, indent=1, sort_keys=True))
        partial.replace(target)  # atomic: xdist workers may write the same answers at once
    except OSError:
        return


def _stats(package: Path) -> list[str]:
    """Every file of ``package`` by path, size and modification time (no contents read: a
    few milliseconds for Thunder's)."""
    out = []
    for file in sorted(package.rglob("*.py")):
        stat = file.stat()
        out.append(f"{file.relative_to(package)} {stat.st_size} {stat.st_mtime_ns}")
    return out


def _contents(paths: Any) -> list[str]:
    out = []
    for root in paths:
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        out += [f"{file.relative_to(ROOT)} {hashlib.sha256(file.read_bytes()).hexdigest()}" for file in files]
    return out


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:32]

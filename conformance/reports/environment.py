"""Which stack ran: versions, and where the Thunder under test came from.

Read from package metadata, so the controller never has to import Thunder.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
from typing import Any

THUNDER_DIST = "lightning-thunder"
THUNDER_SPEC_ENV = "THUNDER_SPEC"


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


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


def describe(backend: str, nproc: int) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "torch": version("torch"),
        "thunder": version(THUNDER_DIST),
        "thunder_source": thunder_source(),
        "litgpt": version("litgpt"),
        "backend": backend,
        "world_size": nproc,
    }

"""One process that runs the conformance suite many times (``pytest.main``) for the kit's own
tests: a run then costs its worlds and cells, not a Python and pytest start.

Requests come on stdin, one JSON object a line: ``{"args": [...], "env": {...}, "output": PATH}``.
For each, the suite runs with ``env`` added to the environment and its terminal output
written to PATH; then one line ``{"returncode": N}`` goes to the original stdout.

Clean runs share one pool of worlds, as the cells of one session do. A run with a planted
bug or a kit fault closes its worlds when it ends: a patch is undone when its task ends, but
what the bug did to Thunder's state in a rank (a flag ``no_sync`` never reset) stays in that
process, and in a shared world it failed the next bug's cells (five of them, once).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from conformance.frontend.runner import RUNNER, new_zygote
from conformance.world.controller import World
from tests.support.plant_plugin import ENV as PLANTED_ENV
from tests.support.plant_plugin import KIT_FAULT_ENV


class SharedWorlds:
    """The plugin that hands every session's runner the same pool of worlds."""

    def __init__(self) -> None:
        self.pool: dict[Any, World] = {}
        # what a rank imports, imported once for every run: a planted bug is patched into a
        # forked rank, never into the zygote, so no bug outlives its run there
        self.zygote = new_zygote()

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        runner = config.stash.get(RUNNER, None)
        if runner is not None:
            runner.share_worlds(self.pool, self.zygote)

    def close(self) -> None:
        for world in self.pool.values():
            world.close()
        self.pool.clear()


def serve() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    shared = SharedWorlds()
    try:
        for line in sys.stdin:
            request = json.loads(line)
            added = request.get("env", {})
            saved = {k: os.environ.get(k) for k in added}
            os.environ.update(added)
            out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            kept = os.dup(1), os.dup(2)
            os.dup2(out, 1)
            os.dup2(out, 2)
            try:
                code = pytest.main(request["args"], plugins=[shared])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(kept[0], 1)
                os.dup2(kept[1], 2)
                for fd in (out, *kept):
                    os.close(fd)
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            if PLANTED_ENV in added or KIT_FAULT_ENV in added:
                shared.close()
            replies.write(json.dumps({"returncode": int(code)}) + "\n")
    finally:
        shared.close()
        shared.zygote.close()


if __name__ == "__main__":
    serve()

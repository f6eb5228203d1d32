"""pytest plugin for the kit's own tests: ``-p tests.plant`` with CONFORMANCE_PLANTED_BUG set
runs the real suite with that bug (from tests/planted_bugs.py) planted in every rank."""

from __future__ import annotations

import os

import pytest

from conformance.frontend.runner import RUNNER
from conformance.world import protocol

ENV = "CONFORMANCE_PLANTED_BUG"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    bug = os.environ[ENV]
    config.stash[RUNNER].cell_task = lambda cell: protocol.Task(
        "tests.planted_bugs:run_cell_with_bug", {"bug": bug, "axes": cell.axes()}
    )

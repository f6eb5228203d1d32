"""pytest plugin for the kit's own tests: ``-p tests.support.plant_plugin`` with CONFORMANCE_PLANTED_BUG
set runs the real suite with that bug (a record of tests/planted/) planted in every rank; with
CONFORMANCE_KIT_FAULT set, with that fault of the kit itself (tests/support/kit_faults.py)."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from conformance.frontend.runner import RUNNER
from conformance.world import protocol
from tests.support import kit_faults

ENV = "CONFORMANCE_PLANTED_BUG"
KIT_FAULT_ENV = "CONFORMANCE_KIT_FAULT"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    runner = config.stash[RUNNER]
    fault = os.environ.get(KIT_FAULT_ENV)
    if fault in kit_faults.PROBE_FAULTS:
        # a rank killed while the compositions are probed; the marker says whether it was yet
        payload = {"fault": fault, "marker": tempfile.mkdtemp(prefix="probe-fault-")}
        runner.probe_task = protocol.Task("tests.support.kit_faults:probe_with_fault", payload)
        return
    if fault is not None:
        lost_at = json.loads(os.environ.get(kit_faults.LOST_AT_ENV, "{}"))
        runner.cell_task = lambda cell: protocol.Task(
            "tests.support.kit_faults:run_cell_with_fault",
            {"fault": fault, "lost_at": lost_at.get(cell.id), **runner.cell_payload(cell)},
        )
        return
    bug = os.environ[ENV]
    runner.cell_task = lambda cell: protocol.Task(
        "tests.planted.registry:run_cell_with_bug", {"bug": bug, **runner.cell_payload(cell)}
    )

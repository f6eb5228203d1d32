"""pytest plugin for the kit's own tests: ``-p tests.support.plant_plugin`` with CONFORMANCE_PLANTED_BUG
set runs the real suite with that bug (a record of tests/planted/) planted in every rank; with
CONFORMANCE_KIT_FAULT set, with that fault of the kit itself (tests/support/kit_faults.py);
``rank_lost`` loses rank 1 of each cell CONFORMANCE_LOST_AT names at the phase it names (the
mechanism of --chaos, at chosen phases); ``controller_killed_at_report`` kills this pytest
process (SIGKILL) while it writes the reports, after report.json and before summary.md;
``agent_killed_at_report`` kills every other node's join agent there instead (a machine's
own ranks are done by then: each world is retired after the last item that needs it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time

import pytest

from conformance.frontend.chaos import Fault
from conformance.frontend.runner import RUNNER
from conformance.world import protocol
from tests.support import kit_faults

ENV = "CONFORMANCE_PLANTED_BUG"
KIT_FAULT_ENV = "CONFORMANCE_KIT_FAULT"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    runner = config.stash[RUNNER]
    fault = os.environ.get(KIT_FAULT_ENV)
    # a probe's fault and rank_lost go together ("probe_node_lost_once+rank_lost")
    kinds = set(fault.split("+")) if fault else set()
    if probe := kinds & set(kit_faults.PROBE_FAULTS):
        # a rank lost while the compositions are probed; the marker says whether it was yet
        payload = {"fault": probe.pop(), "marker": tempfile.mkdtemp(prefix="probe-fault-")}
        runner.probe_task = protocol.Task("tests.support.kit_faults:probe_with_fault", payload)
    if "rank_lost" in kinds:
        lost_at = json.loads(os.environ.get(kit_faults.LOST_AT_ENV, "{}"))
        clean = runner.cell_task
        runner.cell_task = lambda cell: (
            Fault(1, *lost_at[cell.id]).task(clean(cell)) if cell.id in lost_at else clean(cell)
        )
    if "agent_killed_at_report" in kinds:  # every other node's agent SIGKILLed as the reports are written
        from conformance.reports import writer

        summary = writer.summary

        def agents_killed(*args: object, **kwargs: object) -> str:
            from conformance.world.procs import process_state

            agents = runner.nodes.nodes[1:] if runner.nodes is not None else []
            # a node lost in the run's last cell is served again once a new agent has joined
            deadline = time.monotonic() + 60
            while not all(process_state(n.pid)[0] for n in agents) and time.monotonic() < deadline:
                time.sleep(0.2)
                agents = runner.nodes.nodes[1:]
            for node in agents:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGKILL)
            return summary(*args, **kwargs)

        writer.summary = agents_killed
    if kinds & {"rank_lost", "agent_killed_at_report", *kit_faults.PROBE_FAULTS}:
        return
    if fault == "controller_killed_at_report":
        from conformance.reports import writer

        def killed(*args: object, **kwargs: object) -> str:
            os.kill(os.getpid(), signal.SIGKILL)
            raise AssertionError("unreachable")

        writer.summary = killed  # the writer renders summary.md right after writing report.json
        return
    if fault is not None:
        runner.cell_task = lambda cell: protocol.Task(
            "tests.support.kit_faults:run_cell_with_fault", {"fault": fault, **runner.cell_payload(cell)}
        )
        return
    bug = os.environ[ENV]
    runner.cell_task = lambda cell: protocol.Task(
        "tests.planted.registry:run_cell_with_bug", {"bug": bug, **runner.cell_payload(cell)}
    )
    runner.save_task = lambda cell: protocol.Task(
        "tests.planted.registry:save_with_bug", {"bug": bug, **runner.save_payload(cell)}
    )

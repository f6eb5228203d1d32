"""A machine lost at any phase of a cell, in a run across two nodes: that cell's items fail
naming the rank, its node and the phase; a join agent started in the lost node's place (as
Slurm or a person restarts one) serves every later cell, each judged as in a clean run; the
reports are whole, and nothing of the run outlives it.

One suite run holds the whole matrix: node 1 (its join agent, torchrun and its rank, SIGKILLed
at once by that rank: see conformance/rank/faults.py) is lost in the first composition probe,
each of the cheapest real cells of ci loses it at another phase, the cheapest is left
clean, and the agent serving node 1 at the end is SIGKILLed while the reports are written.
The test keeps an agent running on "node 1" throughout, starting a new one whenever the
last has exited. Which rank node 1 holds is the rendezvous's choice (torchrun orders the nodes
by their descriptors, the torchruns' pids on one host), so the lost rank is named by its node."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conformance.frontend.chaos import PHASES
from conformance.matrix.cost import expected_seconds
from conformance.matrix.profiles import cells
from conformance.world import seal
from tests.support.kit_faults import LOST_AT_ENV
from tests.support.plant_plugin import KIT_FAULT_ENV
from tests.support.suite_runs import probed_on_this_machine, run_suite, runs_to_the_end
from tests.worlds.test_kit_errors import _ranks_of
from tests.worlds.test_multinode import TOKEN, _free_port, join, said

pytestmark = pytest.mark.slow  # runs the suite across two agents in a subprocess

SILENCE = 3  # --node-silence: how soon the lost node is known (the kit's default is longer)


class Node:
    """'Node 1': an agent kept running, a new one started whenever the last exited, until the
    run is over (an agent that exits 0 was told so)."""

    def __init__(self, endpoint: str, folder: Path) -> None:
        self.endpoint, self.folder = endpoint, folder
        self.agents: list[subprocess.Popen[bytes]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while not self._done.is_set():
            if not self.agents or self.agents[-1].poll() not in (None, 0):
                self.agents.append(join(self.endpoint, TOKEN, self.folder / f"agent{len(self.agents)}.log"))
            elif self.agents[-1].returncode == 0:
                return
            time.sleep(0.2)

    def said(self) -> list[str]:
        return [line for i in range(len(self.agents)) for line in said(self.folder / f"agent{i}.log")]

    def close(self) -> None:
        """Start no more. An agent that joined exits by itself once its controller is gone
        (killed only where it does not, which the test then finds); one started after the
        last loss may still be waiting for an answer the run, over, never gives: killed."""
        self._done.set()
        self._thread.join()
        for i, agent in enumerate(self.agents):
            joined = any("joined the run" in line for line in said(self.folder / f"agent{i}.log"))
            try:
                agent.wait(timeout=30 if joined else 0.1)
            except subprocess.TimeoutExpired:
                agent.terminate()  # not SIGKILL: the test counts those as the node's losses
                agent.wait()


def test_a_node_lost_at_each_phase_fails_that_cell_alone_and_a_new_agent_takes_its_place(tmp_path: Path) -> None:
    probed = probed_on_this_machine()
    # cells that reach every phase (offered, not negative, not ending at an expected raise)
    real = [c for c in cells("ci", 2, probed) if not c.simulated and c.world_size == 2 and runs_to_the_end(c, probed)]
    cheapest = sorted(real, key=expected_seconds)[: len(PHASES) + 1]
    clean, faulted = cheapest[0], cheapest[1:]
    lost_at = {c.id: [phase, "node"] for c, phase in zip(faulted, PHASES, strict=True)}
    endpoint = f"127.0.0.1:{_free_port()}"
    node = Node(endpoint, tmp_path)
    try:
        run = run_suite(
            tmp_path,
            *("--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", endpoint),
            *("--node-silence", str(SILENCE), "--profile", "ci", "-k", " or ".join(c.id for c in cheapest)),
            # and in the composition probe, the first time: the probe's retry waits for a new agent
            env={
                seal.ENV_TOKEN: TOKEN,
                KIT_FAULT_ENV: "probe_node_lost_once+rank_lost+agent_killed_at_report",
                LOST_AT_ENV: json.dumps(lost_at),
            },
            plant=True,
            shared=False,  # its worlds span the agents' node: none of the pool's one-machine worlds
            timeout=900,
        )
    finally:
        node.close()
    assert run.returncode == 1, run.output
    assert run.report["environment"]["nodes"] == 2 and run.report["environment"]["world_size"] == 2
    by_cell: dict[str, list[dict]] = {}
    for item in run.report["cells"]:
        by_cell.setdefault(item["cell"], []).append(item)
    assert set(by_cell) == {c.id for c in cheapest}, run.output
    assert {i["outcome"] for i in by_cell[clean.id]} <= {"passed", "xfailed"}, by_cell[clean.id]
    for cell in faulted:
        phase = lost_at[cell.id][0]
        for item in by_cell[cell.id]:
            assert item["outcome"] == "failed", (cell.id, phase, item)
            head = item["message"].splitlines()[0]
            assert "the kit broke" not in item["message"]
            assert re.search(r"did not run to completion: rank [01] died during ", head) and phase in head, head
            assert "node 1 (" in item["message"] and "stopped answering" in item["message"], item["message"]
    retried = [w for w in run.report["warnings"] if "did not complete at first and did on a fresh world" in w]
    assert len(retried) == 1 and re.search(r"rank [01]: died", retried[0]), run.report["warnings"]
    assert "node 1 (" in retried[0], retried[0]
    # the node was lost in the probe and once per faulted cell, and a new agent held it for each
    # world after; the last was killed while the reports were written, which are whole
    exits = [agent.returncode for agent in node.agents]
    assert exits.count(-signal.SIGKILL) == len(faulted) + 2, (exits, node.said())
    assert (run.report_dir / "summary.md").read_text().strip() and (run.report_dir / "report.html").is_file()
    assert sum("joined the run" in line for line in node.said()) >= len(faulted) + 1, node.said()
    # every other agent: told the run is over (0), turned away while the node still answered
    # (2), or started after the last loss and never joined before the run ended (terminated)
    for i, code in enumerate(exits):
        lines = said(tmp_path / f"agent{i}.log")
        assert code in (-signal.SIGKILL, 0, 2, -signal.SIGTERM), (i, code, lines)
        assert code != 0 or lines[-1] == "conformance.join: the run is over", lines
    lines = [json.loads(line) for line in (run.report_dir / "report.jsonl").read_text().splitlines()]
    assert len(lines) >= len(run.report["cells"])
    deadline = time.monotonic() + 10
    while _ranks_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ranks_of(tmp_path) == []

"""Worlds across machines, as two "nodes" on the loopback interface: this process's machine
and one join agent (``python -m conformance.join``) in a subprocess, one rank each. A world
spans both, a rank that dies on the agent's node and a node that dies mid-cell each fail the
cell naming the node, an agent that joins after a loss takes the node's place, a join with a
wrong token is refused. The suite across both nodes: tests/worlds/test_node_lost.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.world import procs, protocol, seal
from conformance.world.controller import World
from conformance.world.launch import LaunchSpec
from conformance.world.nodes import Nodes
from tests.support.suite_runs import ROOT

pytestmark = pytest.mark.slow  # starts worlds across two agents

TOKEN = "the token of this test's run"
TIMEOUT = 30.0
SILENCE = 3.0  # how soon a node whose agent stopped counts as lost (the kit's default is longer)
REJOIN = 2.0  # how long the next world waits for an agent to take a lost node's place


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(endpoint: str, token: str, log: Path) -> subprocess.Popen[bytes]:
    """A join agent in a subprocess, as a user starts one on another machine."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "conformance.join", endpoint, "--world-dir", str(log.parent)],
            env={**os.environ, seal.ENV_TOKEN: token},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def said(log: Path) -> list[str]:
    """What the agent said (its own lines, not c10d's warnings about closed stores)."""
    return [line for line in log.read_text().splitlines() if line.startswith("conformance.join: ")]


class Run:
    """The controller's side of a two-node run, with its agent."""

    def __init__(self, tmp: Path) -> None:
        self.endpoint = f"127.0.0.1:{_free_port()}"
        self.nodes = Nodes(self.endpoint, 2, TOKEN, join_timeout=120, silence=SILENCE, rejoin_timeout=REJOIN)
        self.log = tmp / "agent.log"
        self.agent = join(self.endpoint, TOKEN, self.log)
        self.world = World(LaunchSpec(nproc=1, backend="gloo"), base_dir=tmp, failure_grace=3.0, nodes=self.nodes)

    def task(self, fn: str, **kwargs: object) -> protocol.Task:
        return protocol.Task(f"tests.support.faulty_programs:{fn}", kwargs)

    def close(self) -> None:
        self.world.close()
        self.nodes.close()
        if self.agent.poll() is None:
            self.agent.kill()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    r = Run(tmp_path_factory.mktemp("multinode"))
    yield r
    r.close()


def test_a_world_spans_both_nodes(run: Run) -> None:
    outcome = run.world.run(run.task("healthy"), TIMEOUT)
    assert outcome.ok, outcome.describe() + "\n".join(said(run.log))
    assert [v["sum"] for v in outcome.values] == [2.0, 2.0]  # an all-reduce across the two torchruns
    assert list(run.world.remote.values()) == [1], "one rank on the agent's node"
    again = run.world.run(run.task("healthy"), TIMEOUT)
    assert again.ok and again.startup == 0.0, "the world across nodes is reused"


def test_a_join_with_a_wrong_token_is_refused(run: Run, tmp_path: Path) -> None:
    # xdist may hand this test to a worker whose run has not started a world yet: the agent
    # joins while the first world starts, so start one before the stray comes
    assert run.world.run(run.task("healthy"), TIMEOUT).ok
    stray = join(run.endpoint, "a guess", tmp_path / "stray.log")
    assert stray.wait(timeout=120) == 2
    refused = f"conformance.join: refused by the controller at {run.endpoint}: wrong token"
    assert said(tmp_path / "stray.log") == [refused]
    assert [n.rank for n in run.nodes.nodes] == [0, 1] and run.nodes.refusals[-1].endswith("wrong token")


def test_a_rank_that_dies_on_the_other_node_is_named_with_its_node(run: Run) -> None:
    assert run.world.run(run.task("healthy"), TIMEOUT).ok
    [remote] = run.world.remote
    outcome = run.world.run(run.task("sigkill_on", rank=remote), TIMEOUT)
    blamed = outcome.culprits()[0]
    assert (blamed.rank, blamed.status) == (remote, protocol.DIED), outcome.describe()
    assert f"killed by signal SIGKILL on node 1 ({socket.gethostname()})" in blamed.error, outcome.describe()
    after = run.world.run(run.task("healthy"), TIMEOUT)
    assert after.ok and after.startup > 0.0, after.describe()


def test_a_node_that_dies_mid_cell_fails_the_cell_naming_the_node(run: Run) -> None:
    """Last: the run has lost its second node after it."""
    healthy = run.world.run(run.task("healthy"), TIMEOUT)
    assert healthy.ok, healthy.describe()
    [remote] = run.world.remote
    killer = _kill_later(run.agent, after=3.0)
    began = time.monotonic()
    outcome = run.world.run(run.task("hang_in_collective", rank=remote), TIMEOUT)
    elapsed = time.monotonic() - began
    killer.join()
    assert elapsed < 3.0 + SILENCE + 8.0, f"took {elapsed:.1f}s"
    blamed = outcome.culprits()[0]
    assert (blamed.rank, blamed.status) == (remote, protocol.DIED), outcome.describe()
    assert f"node 1 ({socket.gethostname()}) stopped answering" in blamed.error, outcome.describe()
    local = outcome.results[1 - remote]
    assert local.status == protocol.ABORTED and "hang_in_collective" in (local.stacks or ""), outcome.describe()
    # no agent takes its place: the next cell fails once REJOIN is waited out, naming the node,
    # instead of waiting for a world that cannot start
    again = run.world.run(run.task("healthy"), TIMEOUT)
    assert not again.ok and "node 1" in again.results[0].error and again.startup < REJOIN + 5.0, again.describe()
    assert f"no join agent took its place within {REJOIN:.0f}s" in again.results[0].error, again.describe()
    # the lost node's rank, alive still (only its agent was killed), leaves with the world it served
    deadline = time.monotonic() + 10
    while procs.process_state(healthy.values[remote]["pid"])[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not procs.process_state(healthy.values[remote]["pid"])[0], "an orphaned rank outlived its world"


def test_an_agent_that_joins_takes_the_lost_nodes_place_and_the_one_it_replaced_leaves(
    run: Run, tmp_path: Path
) -> None:
    """Node 1 lost (its agent killed, if a test before this one on the worker did not): an
    agent started there (as Slurm or a person restarts one) takes its place; an agent that only
    fell silent (stopped) is taken for lost and replaced too, and when it wakes it leaves
    instead of starting a second part."""
    if run.agent.poll() is None:  # xdist may have run this module's other tests elsewhere
        assert run.world.run(run.task("healthy"), TIMEOUT).ok  # the module's agent holds node 1
        run.agent.kill()
        run.agent.wait()
        run.world.kill()  # its node-1 part was the killed agent's: lost with it (Nodes.lost_to)
    deadline = time.monotonic() + 60
    while 1 not in run.nodes.lost():
        assert time.monotonic() < deadline, "node 1 never counted as lost"
        time.sleep(0.2)
    first = join(run.endpoint, TOKEN, tmp_path / "first.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        _joined(run, first, tmp_path / "first.log")
        outcome = run.world.run(run.task("healthy"), TIMEOUT)
        assert outcome.ok, outcome.describe() + "\n".join(said(tmp_path / "first.log"))
        assert run.nodes.nodes[1].first_world > 0, "a replacement serves the run's next world, not its first"
        first.send_signal(signal.SIGSTOP)  # silent, not dead
        time.sleep(SILENCE + 1.0)
        second = join(run.endpoint, TOKEN, tmp_path / "second.log")
        _joined(run, second, tmp_path / "second.log")
        run.world.kill()  # the world whose node-1 part the silent agent started
        fresh = run.world.run(run.task("healthy"), TIMEOUT)
        assert fresh.ok and fresh.startup > 0.0, fresh.describe() + "\n".join(said(tmp_path / "second.log"))
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=30) == 1
        assert said(tmp_path / "first.log")[-1].endswith("after this one fell silent: leaving")
    finally:
        for agent in (first, second):
            if agent is not None and agent.poll() is None:
                agent.send_signal(signal.SIGCONT)
                agent.kill()


def _joined(run: Run, agent: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until ``agent`` holds node 1."""
    deadline = time.monotonic() + 120
    while run.nodes.nodes[1].pid != agent.pid:
        assert agent.poll() is None and time.monotonic() < deadline, "\n".join(said(log))
        time.sleep(0.2)


def _kill_later(agent: subprocess.Popen[bytes], after: float) -> threading.Thread:
    """The node dies: its agent is killed while a cell runs (its rank is left running)."""

    def kill() -> None:
        time.sleep(after)
        agent.send_signal(signal.SIGKILL)
        agent.wait()

    thread = threading.Thread(target=kill)
    thread.start()
    return thread


def test_an_agent_exits_with_its_controller(tmp_path: Path) -> None:
    """A controller killed outright: its agent stops its worlds and exits 1, saying why."""
    endpoint = f"127.0.0.1:{_free_port()}"
    listen = f"from conformance.world.nodes import Nodes; n = Nodes({endpoint!r}, 2, {TOKEN!r}); input()"
    controller = subprocess.Popen([sys.executable, "-c", listen], cwd=ROOT, stdin=subprocess.PIPE)
    log = tmp_path / "agent.log"
    agent = join(endpoint, TOKEN, log)
    try:
        deadline = time.monotonic() + 120
        while not any("joined the run" in line for line in said(log)) and time.monotonic() < deadline:
            assert agent.poll() is None, "\n".join(said(log))
            time.sleep(0.2)
        controller.kill()
        assert agent.wait(timeout=30) == 1
        assert said(log)[-1].endswith(
            f"the controller at {endpoint} is gone without ending the run: this node's worlds stop"
        )
    finally:
        for process in (controller, agent):
            if process.poll() is None:
                process.kill()

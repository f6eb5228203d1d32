"""The runner under faults: every way a rank can stop answering ends in a verdict that names
the rank, within the cell timeout plus a few seconds, and the next cell runs in a fresh world."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from conformance.world import protocol
from conformance.world.controller import STOP_GRACE_S, World
from conformance.world.launch import LaunchSpec

pytestmark = pytest.mark.slow  # starts worlds or runs the suite in a subprocess

TIMEOUT = 10.0
SLACK = 8.0  # stack collection, killing the world; a world start is not counted


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(LaunchSpec(nproc=2, backend="gloo"), base_dir=tmp_path_factory.mktemp("worlds"), failure_grace=3.0)
    yield w
    w.close()


def run(world: World, fn: str, **kwargs: object) -> protocol.Task:
    return world.run(protocol.Task(f"tests.support.faulty_programs:{fn}", kwargs), timeout=TIMEOUT)


def test_healthy_tasks_reuse_one_world(world: World) -> None:
    first = run(world, "healthy")
    second = run(world, "healthy")
    assert first.ok and second.ok, first.describe() + second.describe()
    assert [v["sum"] for v in second.values] == [2.0, 2.0]
    assert second.startup == 0.0, "a healthy world must be reused"
    assert [v["pid"] for v in first.values] == [v["pid"] for v in second.values]


FAULTS = [
    # (program, kwargs, culprit rank, its status, what its account must say, the peer's status)
    ("raise_on", {"rank": 1}, 1, protocol.FAILED, "planted failure on rank 1", protocol.ABORTED),
    ("hang_on", {"rank": 0}, 0, protocol.TIMEOUT, "cell timeout", protocol.PASSED),
    ("sigkill_on", {"rank": 1}, 1, protocol.DIED, "signal SIGKILL", None),
    ("sigstop_on", {"rank": 1}, 1, protocol.STOPPED, "stopped (SIGSTOP)", protocol.ABORTED),
    # the peer's death comes within the stop's grace: the stop is still why, and says so
    ("sigstop_then_peer_dies", {"rank": 1}, 1, protocol.STOPPED, "stopped (SIGSTOP)", protocol.DIED),
    ("exit_on", {"rank": 0, "code": 3}, 0, protocol.DIED, "exited with code 3", None),
    ("segfault_on", {"rank": 1}, 1, protocol.DIED, "signal SIGSEGV", None),
    ("unserializable", {}, 0, protocol.FAILED, "not JSON serializable", protocol.FAILED),
]


@pytest.mark.parametrize(
    ("fn", "kwargs", "culprit", "status", "says", "peer_status"), FAULTS, ids=[f[0] for f in FAULTS]
)
def test_fault_is_reported_and_the_next_cell_passes(
    world: World, fn: str, kwargs: dict, culprit: int, status: str, says: str, peer_status: str | None
) -> None:
    run(world, "healthy")  # the fault must not be charged with a world start
    began = time.monotonic()
    outcome = run(world, fn, **kwargs)
    elapsed = time.monotonic() - began

    assert not outcome.ok
    assert elapsed < TIMEOUT + SLACK, f"took {elapsed:.1f}s"
    blamed = outcome.culprits()[0]
    assert (blamed.rank, blamed.status) == (culprit, status), outcome.describe()
    assert says in blamed.error, outcome.describe()
    if peer_status is not None:
        assert outcome.results[1 - culprit].status == peer_status, outcome.describe()
    assert f"rank {culprit}: {status}" in outcome.describe()

    after = run(world, "healthy")
    assert after.ok, after.describe()
    assert after.startup > 0.0, "a world that saw a fault must be replaced"


def test_a_stopped_rank_is_given_up_after_a_grace_not_at_the_timeout(world: World) -> None:
    run(world, "healthy")
    began = time.monotonic()
    outcome = world.run(protocol.Task("tests.support.faulty_programs:sigstop_on", {"rank": 0}), timeout=120)
    elapsed = time.monotonic() - began
    assert outcome.culprits()[0].status == protocol.STOPPED, outcome.describe()
    assert elapsed < STOP_GRACE_S + SLACK, f"took {elapsed:.1f}s"
    assert "all_reduce" in (outcome.results[1].stacks or ""), "its peer, waiting on it: " + outcome.describe()


def test_hanging_rank_is_shown_where_it_hangs(world: World) -> None:
    outcome = run(world, "hang_on", rank=1)
    stacks = outcome.results[1].stacks or ""
    assert "in hang_on" in stacks, outcome.describe()


def test_waiting_peer_is_shown_in_its_collective(world: World) -> None:
    outcome = run(world, "raise_on", rank=0)
    assert "all_reduce" in (outcome.results[1].stacks or ""), outcome.describe()
    assert "ValueError: planted failure on rank 0" in outcome.results[0].error


def test_segfault_leaves_the_python_stack_in_the_rank_log(world: World) -> None:
    outcome = run(world, "segfault_on", rank=0)
    assert "Segmentation fault" in (outcome.results[0].log_tail or ""), outcome.describe()
    assert "segfault_on" in outcome.results[0].log_tail


def test_world_that_cannot_start_fails_the_cell_not_the_session(tmp_path) -> None:
    broken = World(LaunchSpec(nproc=2, backend="no-such-backend"), base_dir=tmp_path, start_timeout=60)
    try:
        outcome = broken.run(protocol.Task("tests.support.faulty_programs:healthy"), timeout=TIMEOUT)
    finally:
        broken.close()
    assert not outcome.ok
    assert "the world did not start" in outcome.results[0].error
    assert "no-such-backend" in outcome.results[0].error.lower()


def test_a_rank_killed_while_the_world_starts_is_named_and_its_peer_aborted(tmp_path) -> None:
    """Rank 1 killed before it greets (fresh ranks import torch for seconds first): the world
    does not start, and the account names rank 1, dead during the world's start, and its
    peer stopped waiting on it, not a start that merely failed."""
    import os
    import signal
    import threading

    from conformance.world import procs
    from conformance.world.controller import START

    world = World(LaunchSpec(nproc=2, backend="gloo"), base_dir=tmp_path, start_timeout=60)
    killed: list[int] = []

    def kill_rank_1() -> None:
        deadline = time.monotonic() + 30
        while not killed and time.monotonic() < deadline:
            for world_dir in tmp_path.glob("world-*"):
                if pid := procs.launched_ranks(protocol.ENV_WORLD_DIR, str(world_dir)).get(1):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.01)

    killer = threading.Thread(target=kill_rank_1)
    killer.start()
    try:
        outcome = run(world, "healthy")
    finally:
        killer.join()
        world.close()
    assert killed, "rank 1 was never seen starting"
    assert [r.status for r in outcome.results] == [protocol.ABORTED, protocol.DIED], outcome.describe()
    assert all(r.phase == START and "the world did not start" in (r.error or "") for r in outcome.results)
    assert outcome.describe().startswith(f"--- rank 1: died after 0.0s during {START} ---")

"""Ranks forked from a zygote: they work as fresh ones do, cost no import, and never outlive
the stub that torchrun watches in their place."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.frontend.runner import new_zygote
from conformance.world import procs, protocol
from conformance.world.controller import World
from conformance.world.launch import LaunchSpec
from conformance.world.zygote import Zygote

pytestmark = pytest.mark.slow  # starts worlds

GONE_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = new_zygote()
    yield z
    z.close()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _stub_of(rank: int, world_dir: Path) -> int:
    """The process torchrun started for ``rank`` of the world in ``world_dir``: its stub."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        ours = env.get(b"RANK") == str(rank).encode() and env.get(protocol.ENV_WORLD_DIR.encode()) == bytes(world_dir)
        if b"conformance.world.forked" in argv and b"conformance.world.rankloop" in argv and ours:
            return int(entry.name)
    raise LookupError(f"no stub of rank {rank} in {world_dir}")


def test_forked_ranks_work_and_start_in_a_fraction_of_a_fresh_start(zygote: Zygote, tmp_path: Path) -> None:
    first = World(LaunchSpec(nproc=2, backend="gloo", zygote=zygote.path), base_dir=tmp_path)
    try:
        first.start()  # the zygote's own imports are paid here, once
    finally:
        first.close()
    forked = World(LaunchSpec(nproc=3, backend="gloo", zygote=zygote.path), base_dir=tmp_path)
    fresh = World(LaunchSpec(nproc=3, backend="gloo"), base_dir=tmp_path)
    try:
        took = {"fork": forked.start(), "fresh": fresh.start()}
        for world in (forked, fresh):
            outcome = world.run(protocol.Task("tests.support.faulty_programs:healthy"), timeout=60)
            assert outcome.ok, outcome.describe()
            assert [v["sum"] for v in outcome.values] == [3.0] * 3
        pids = [v["pid"] for v in forked.run(protocol.Task("tests.support.faulty_programs:healthy"), 60).values]
        assert {_parent(p) for p in pids} == {zygote._proc.pid}, "the ranks should be the zygote's children"
        # a fresh rank imports torch and Thunder (seconds of CPU each); a forked one imports nothing
        assert took["fork"] < took["fresh"] / 2, took
    finally:
        forked.close()
        fresh.close()


def test_a_stub_killed_outright_takes_its_rank_down(zygote: Zygote, tmp_path: Path) -> None:
    world = World(LaunchSpec(nproc=2, backend="gloo", zygote=zygote.path), base_dir=tmp_path)
    try:
        world.start()
        rank1 = world._pids[1]
        os.kill(_stub_of(1, world._dir), signal.SIGKILL)  # no signal can be passed on
        killed = time.monotonic()
        while _alive(rank1) and time.monotonic() - killed < GONE_WITHIN_S:
            time.sleep(0.1)
        assert not _alive(rank1), f"rank 1 still runs {GONE_WITHIN_S:.0f} s after its stub was killed"
    finally:
        world.close()


def test_a_forked_rank_that_dies_is_named_with_its_signal(zygote: Zygote, tmp_path: Path) -> None:
    """The zygote reaps a dead forked rank; its stub leaves the wait status in the world's
    folder, so the account names the signal however late the controller looked."""
    world = World(LaunchSpec(nproc=2, backend="gloo", zygote=zygote.path), base_dir=tmp_path)
    try:
        assert world.run(protocol.Task("tests.support.faulty_programs:healthy"), 60).ok
        forked, folder = world._pids[1], world._dir
        outcome = world.run(protocol.Task("tests.support.faulty_programs:sigkill_on", {"rank": 1}), 60)
        assert (outcome.results[1].status, outcome.results[1].error) == (
            protocol.DIED,
            "the rank process was killed by signal SIGKILL",
        ), outcome.describe()
        # the controller may read the zombie's status before the zygote's next reap (a loaded
        # machine delays it), so reaping is asked for within a bound, not at once
        reaped_by = time.monotonic() + GONE_WITHIN_S
        while procs.process_state(forked) != (False, None) and time.monotonic() < reaped_by:
            time.sleep(0.05)
        assert procs.process_state(forked) == (False, None), "the zygote never reaped its dead child"
        assert procs.forked_status(folder, 1, wait_s=0) == signal.SIGKILL
    finally:
        world.close()


def test_a_stub_whose_zygote_is_unreachable_starts_its_program_afresh(tmp_path: Path) -> None:
    world = World(LaunchSpec(nproc=2, backend="gloo", zygote=str(tmp_path / "no-such-socket")), base_dir=tmp_path)
    try:
        world.start()
        outcome = world.run(protocol.Task("tests.support.faulty_programs:healthy"), timeout=60)
        assert outcome.ok, outcome.describe()
        said = (world._dir / "torchrun.log").read_text()  # where the stubs' standard error goes
    finally:
        world.close()
    assert "could not fork torch.distributed.run" in said
    assert said.count("could not fork conformance.world.rankloop") == 2

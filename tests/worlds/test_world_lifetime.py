"""What a world costs while it waits, and that it never outlives its controller."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.frontend.runner import new_zygote
from conformance.world import protocol
from conformance.world.controller import World
from conformance.world.launch import LaunchSpec

pytestmark = pytest.mark.slow  # starts worlds

IDLE_S = 10.0
# A waiting rank's own threads spend nothing; what an idle rank costs is gloo's transport
# loop, whose epoll_wait wakes every 10 ms (about 0.2% of a core here). Polling the store, as
# the rank loop once did every 5 ms, cost 2.1%: 1% tells the two apart without flaking on
# gloo's ticks (10 ms each in /proc's accounting).
IDLE_CPU_SHARE = 0.01
HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system time of ``pid`` and all its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / HZ


@pytest.fixture(params=["fresh", "fork"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """A world of fresh ranks, and one whose ranks (and torchrun) are forked from a zygote."""
    zygote = new_zygote() if request.param == "fork" else None
    w = World(LaunchSpec(nproc=2, backend="gloo", zygote=zygote and zygote.path), base_dir=tmp_path)
    yield w
    w.close()
    if zygote is not None:
        zygote.close()


def test_an_idle_world_costs_no_cpu(world: World) -> None:
    outcome = world.run(protocol.Task("tests.support.faulty_programs:healthy"), timeout=60)
    assert outcome.ok, outcome.describe()
    pids = [v["pid"] for v in outcome.values]
    before = [cpu_seconds(p) for p in pids]
    time.sleep(IDLE_S)
    spent = [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
    allowed = IDLE_CPU_SHARE * IDLE_S
    assert all(s <= allowed for s in spent), f"idle ranks spent {spent} s of CPU in {IDLE_S} s (allowed {allowed})"


# A controller in a process of its own, so that the test can kill it mid-task: it starts a
# world, says which processes it holds, and runs a task in which rank 0 hangs and rank 1
# waits for it in an all-reduce (the case where a rank would wait out gloo's timeout).
CONTROLLER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from conformance.frontend.runner import new_zygote
    from conformance.world import protocol
    from conformance.world.controller import World
    from conformance.world.launch import LaunchSpec

    zygote = new_zygote() if sys.argv[2] == "fork" else None
    world = World(LaunchSpec(nproc=2, backend="gloo", zygote=zygote and zygote.path), base_dir=Path(sys.argv[1]))
    world.start()
    held = {"torchrun": world._proc.pid, "ranks": list(world._pids.values())}
    if zygote is not None:
        held["zygote"] = zygote._proc.pid
    print(json.dumps(held), flush=True)
    world.run(protocol.Task("tests.support.faulty_programs:hang_in_collective", {"rank": 0}), timeout=600)
    """
)
GONE_WITHIN_S = 10.0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("start", ["fresh", "fork"])
def test_a_killed_controller_takes_its_ranks_down_mid_task(tmp_path: Path, start: str) -> None:
    root = Path(__file__).resolve().parents[2]
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(tmp_path), start], cwd=root, stdout=subprocess.PIPE, text=True
    )
    held: dict[str, object] = {"torchrun": None, "ranks": [], "zygote": None}
    try:
        line = controller.stdout.readline()
        assert line, "the controller did not start its world"
        held = json.loads(line)
        time.sleep(2.0)  # the task is under way: rank 1 waits in its all-reduce
        assert all(_alive(p) for p in held["ranks"]), "the ranks should still be working"
        controller.send_signal(signal.SIGKILL)
        controller.wait()
        killed = time.monotonic()
        pids = [held["torchrun"], *held["ranks"], *([held["zygote"]] if held.get("zygote") else [])]
        while any(_alive(p) for p in pids) and time.monotonic() - killed < GONE_WITHIN_S:
            time.sleep(0.1)
        left = [p for p in pids if _alive(p)]
        assert not left, f"still running {GONE_WITHIN_S:.0f} s after their controller was killed: {left}"
    finally:  # a failed test must not leave the world behind either
        controller.kill()
        for pid in [held["torchrun"], *held["ranks"], held.get("zygote")]:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

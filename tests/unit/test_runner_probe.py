"""The runner's choices before any cell runs, with a stand-in world (no world is started):
the compositions probed once and the cells chosen over those that run, a probe that does
not complete asked once more and, failing twice, leaving no cell to run, and cells too large
for the visible GPUs reported unsupported."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.checks.findings import CellResult
from conformance.frontend.lifetimes import Lifetimes
from conformance.frontend.options import KitConfig, XdistPlace
from conformance.frontend.probing import PROBE
from conformance.frontend.runner import Runner
from conformance.matrix.cells import Cell
from conformance.matrix.profiles import cells
from conformance.reports.session import SessionInfo
from conformance.world import launch, protocol
from conformance.world.outcome import Outcome

LEGACY = "thunder.distributed.fsdp(nn.Module) raises TypeError: planted"


class StandInWorld:
    """``ok``: whether each task completes, or a list of that for the tasks in turn."""

    def __init__(self, size: int, answer: object, ok: bool | list[bool] = True) -> None:
        self.size, self.answer, self.ok, self.tasks = size, answer, ok, []

    def run(self, task: protocol.Task, timeout: float) -> Outcome:
        self.tasks.append(task.fn)
        ok = self.ok if isinstance(self.ok, bool) else self.ok[len(self.tasks) - 1]
        status = protocol.PASSED if ok else protocol.FAILED
        error = None if ok else "Traceback: planted probe failure"
        results = [protocol.RankResult(r, status, self.answer, error) for r in range(self.size)]
        return Outcome(results, duration=0.1, startup=2.0 if len(self.tasks) == 1 else 0.0)

    def close(self) -> None:
        pass


def make_runner(
    world: StandInWorld, backend: str = "gloo", profile: str = "ci", place: XdistPlace | None = None
) -> Runner:
    runner = Runner.__new__(Runner)  # the state __init__ makes of the run's options
    runner.config = KitConfig(cell_timeout=10.0, xdist=place or XdistPlace())
    runner.session = SessionInfo(backend, world.size, profile, False, Path("xfails.toml"), True)
    runner._cells, runner._unsupported, runner._startup_owed = None, None, {}
    runner.probe_failure, runner.run_warnings = None, []
    runner.expectations, runner.thunder_version = [], None  # no xfails entry holds
    runner.probe_cached = None
    runner.worlds, runner.outcomes = {(world.size, False): world}, {}
    runner.cell_task = lambda cell: protocol.Task("stand.in:run", {"axes": cell.axes()})
    runner.probe_task = protocol.Task(PROBE)
    runner.lifetimes, runner._index, runner._retired, runner._pooled = Lifetimes(1, False), None, [], False
    return runner


def test_the_probe_runs_once_and_the_cells_are_chosen_over_what_runs() -> None:
    world = StandInWorld(2, {"fsdp_jit": None, "jit_fsdp": None, "legacy_jit_fsdp": LEGACY})
    runner = make_runner(world)
    assert runner.cells == cells("ci", 2, {"legacy_jit_fsdp": LEGACY})
    assert runner.cells is runner.cells and world.tasks == [PROBE]
    assert sum(c.composition == "legacy_jit_fsdp" for c in runner.cells) == 1
    # the probe started the world: the first cell it serves is charged with that start
    first = runner.run(next(c for c in runner.cells if c.world_size == 2))
    assert first.startup == 2.0 and world.tasks[1] == "stand.in:run"


def test_a_probe_that_fails_once_is_asked_again_on_a_fresh_world() -> None:
    world = StandInWorld(2, {"fsdp_jit": None, "jit_fsdp": None, "legacy_jit_fsdp": LEGACY}, ok=[False, True])
    runner = make_runner(world)
    assert runner.cells == cells("ci", 2, {"legacy_jit_fsdp": LEGACY}) and world.tasks == [PROBE, PROBE]
    assert runner.probe_failure is None
    assert "did not complete at first and did on a fresh world" in runner.run_warnings[0]
    assert "planted probe failure" in runner.run_warnings[0]


def test_a_probe_that_fails_twice_ends_the_run_and_never_passes_for_support() -> None:
    world = StandInWorld(2, None, ok=False)
    runner = make_runner(world)
    assert runner.cells == [] and world.tasks == [PROBE, PROBE]  # no cell: nothing is judged
    assert runner.probe_failure is not None and "did not complete, twice" in runner.probe_failure
    assert runner.unsupported == {} and runner.cells == [] and world.tasks == [PROBE, PROBE]  # not asked a third time
    assert runner.run_warnings[0].count("planted probe failure") == 4  # both ranks of both tries


def test_a_cell_larger_than_the_visible_gpus_is_unsupported_under_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "cuda", lambda: launch.Cuda(2))
    world = StandInWorld(2, CellResult().to_json())
    runner = make_runner(world, backend="nccl")
    outcome = runner.run(Cell("mlp", "real", "fsdp_jit", world_size=4))
    assert outcome.ok and len(outcome.results) == 4
    assert {CellResult.from_json(v).unsupported for v in outcome.values} == {
        "a world of 4 ranks needs 4 GPUs under nccl, 2 are visible"
    }
    assert world.tasks == []  # no world was asked
    assert runner.run(Cell("mlp", "real", "fsdp_jit", world_size=2)).ok and world.tasks == ["stand.in:run"]


def test_an_xdist_workers_failed_probe_reaches_the_controller() -> None:
    """Under -n the workers probe and collect; the controller, which ends the run, hears of a
    probe that failed twice from the worker's output (both ends measured by hand: exit 6)."""
    import types

    from conformance.frontend.probing import PROBE_FAILED, RunEnd

    worker, controller = make_runner(StandInWorld(2, None, ok=False)), make_runner(StandInWorld(2, None))
    assert worker.cells == []
    config = types.SimpleNamespace(workeroutput={})
    session = types.SimpleNamespace(config=config, exitstatus=5)
    RunEnd(worker).pytest_sessionfinish(session, 5)
    assert session.exitstatus == PROBE_FAILED and config.workeroutput["probe_failure"] == worker.probe_failure
    RunEnd(controller).pytest_testnodedown(types.SimpleNamespace(workeroutput=config.workeroutput), None)
    assert controller.probe_failure == worker.probe_failure and controller.run_warnings == worker.run_warnings

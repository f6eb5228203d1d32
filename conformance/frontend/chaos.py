"""``--chaos SEED``: the kit tested on itself, for nightly. In a seeded share of the run's
cells one process of the world is killed (SIGKILL) the moment it enters a phase drawn from
those a cell passes through (conformance/rank/progress.py names them; the rank side is
conformance/rank/faults.py). Such a cell must end naming that rank and phase, and is then
reported xfailed ("lost as planned"); every other cell must end as a clean run's does, which
``python -m conformance.compare CLEAN CHAOS`` shows item by item.

The plan is a pure function of the seed and the cell's id: the same cells fail the same way
on every run, and a failing one reruns alone with the same ``--chaos SEED``.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from conformance.matrix.cells import Cell
from conformance.matrix.simulated import sampled_ranks, world_of
from conformance.reports.outcomes import CHAOS_LOST, CHAOS_MISREPORTED, CHAOS_NOT_REACHED, cell_of
from conformance.world import protocol
from conformance.world.outcome import Outcome

LOSE = "conformance.rank.faults:lose"  # named, never imported here: the ranks import it
# Parts of the phase names a cell passes through (a simulated cell's "forward and backward"
# holds two): setup, its record, a training step's parts, the scenario, the round trip, the
# checks. A phase the cell lacks (an inference scenario's backward) leaves it unfaulted.
PHASES = (
    "Thunder's transforms",
    "recording setup",
    "forward",
    "backward",
    "gathering",
    "optimizer step",
    "scenario",
    "state dict round trip",
    "checks",
)
DEFAULT_SHARE = 0.1
# how the process is lost: killed, or stopped (SIGSTOP: given up after the controller's
# STOP_GRACE_S, a few seconds more per faulted cell)
DRAWN_HOW = ("kill", "stop")  # of conformance/rank/faults.py's HOW: a node is lost only across machines


@dataclasses.dataclass(frozen=True)
class Fault:
    """One process of a cell's world (its RANK: in a simulated world the process's index,
    not the sampled rank it acts as), lost entering ``phase``: killed, stopped, or with its
    node (``how``; another node's rank only: its machine's agent, torchrun and ranks killed)."""

    process: int
    phase: str
    how: str = "kill"

    def task(self, task: protocol.Task) -> protocol.Task:
        """``task`` as the world runs it with this fault armed."""
        kwargs = {"fn": task.fn, "kwargs": task.kwargs, "process": self.process, "phase": self.phase, "how": self.how}
        return protocol.Task(LOSE, kwargs)

    def status(self) -> str:
        """How the controller finds the lost process: dead, or stopped."""
        return protocol.STOPPED if self.how == "stop" else protocol.DIED

    def fired(self, outcome: Outcome) -> bool:
        """Whether the process was lost (it entered the phase)."""
        lost = outcome.results[self.process] if self.process < len(outcome.results) else None
        if lost is None:
            return False
        # a stop found only at the cell timeout (it came within STOP_GRACE_S of it) counts too
        return lost.status == self.status() or (self.how == "stop" and lost.status == protocol.TIMEOUT and lost.stopped)

    def blamed(self, outcome: Outcome) -> bool:
        """Whether the world's account blames the lost process first, in the planned phase."""
        first = outcome.culprits()[0] if not outcome.ok else None
        return first is not None and first.rank == self.process and self.phase in (first.phase or "")

    def describe(self, cell: Cell) -> str:
        rank = sampled_ranks(cell.world_size)[self.process] if cell.simulated else self.process
        verb = {"kill": "killed", "stop": "stopped", "node": "lost with its node"}[self.how]
        return f"rank {rank} {verb} entering {self.phase!r}"


@dataclasses.dataclass(frozen=True)
class Chaos:
    seed: int
    share: float = DEFAULT_SHARE

    def fault(self, cell: Cell) -> Fault | None:
        """The fault planned for ``cell``, or None (most cells)."""
        draw = random.Random(f"{self.seed}/{cell.id}")  # a str seed is hashed the same on every run
        if draw.random() >= self.share:
            return None
        process, phase = draw.randrange(world_of(cell)[0]), draw.choice(PHASES)
        # drawn last, so that which process and phase stay what they were before stops were drawn
        return Fault(process=process, phase=phase, how=draw.choice(DRAWN_HOW))


def judged(fault: Fault, outcome: Outcome, failed: bool, message: str) -> str:
    """What became of ``fault`` in a cell whose item ``failed`` with ``message`` (its first
    line is the cell's account of who went first)."""
    if not fault.fired(outcome):
        return CHAOS_NOT_REACHED
    head = message.splitlines()[0] if message else ""
    said = f" {outcome.results[fault.process].status} during " in head and fault.phase in head
    return CHAOS_LOST if failed and fault.blamed(outcome) and said else CHAOS_MISREPORTED


class Plugin:
    """Arms the planned faults in the cells' tasks and judges each faulted cell's items."""

    def __init__(self, runner: Any, chaos: Chaos) -> None:
        self.runner = runner
        self.chaos = chaos
        cell_task = runner.cell_task

        def armed(cell: Cell) -> protocol.Task:
            fault = chaos.fault(cell)
            return cell_task(cell) if fault is None else fault.task(cell_task(cell))

        runner.cell_task = armed

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
        report = yield
        cell = cell_of(item)
        fault = self.chaos.fault(cell) if cell is not None and call.when == "call" else None
        outcome = self.runner.outcomes.get(cell.id) if fault is not None else None
        if fault is None or outcome is None:  # no fault, or a cell no world ran (refused here)
            return report
        verdict = judged(fault, outcome, report.failed, report.longreprtext)
        planned = fault.describe(cell)
        note = {"seed": self.chaos.seed, "share": self.chaos.share, "fault": planned, "verdict": verdict}
        report.user_properties.append(("chaos", json.dumps(note)))
        if verdict == CHAOS_LOST:
            report.outcome, report.wasxfail = "skipped", f"--chaos {self.chaos.seed}: {planned}, as planned"
        elif verdict == CHAOS_MISREPORTED:
            report.outcome = "failed"
            differs = f"--chaos {self.chaos.seed}: {planned}; the cell's account differs:"
            report.longrepr = f"{differs}\n{report.longreprtext}"
        return report


def install(config: pytest.Config, runner: Any) -> None:
    """Under --chaos (``options.build`` has checked the share), the plugin that plants and judges."""
    if runner.config.chaos is not None:
        plan = Chaos(runner.config.chaos, runner.config.chaos_share)
        config.pluginmanager.register(Plugin(runner, plan), "conformance-chaos")

"""What a cell is expected to cost before it runs, in seconds on this kind of machine: which
cells carry ci's second compilations (``arrays.grown``) and the order a run takes
(``order``) read it, never what any check expects. A run given an earlier report (``--baseline``)
orders by that report's measured times instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conformance.matrix.cells import DEFAULT_SCENARIO, Cell
from conformance.matrix.simulated import world_of
from fixtures.compositions import COMPOSITIONS
from fixtures.models import fixture_for
from fixtures.options import INFERENCE

# about how many compilations of the cell's model a scenario adds: a forward alone for
# no_grad, a no_sync forward and backward, a second shape's, and a fresh composition for each
# checkpoint kind (full; sharded too where parameters are: conformance/rank/scenarios/resume.py)
SCENARIO_COMPILATIONS = {"infer": 0.6, "accumulate": 1.0, "reshape": 1.0, "resume": 1.0}
# tensor parallelism's inference compiles a forward alone, in place of training's forward and
# backward: what it costs of the model's tracing (infer's share)
INFERENCE_SHARE = SCENARIO_COMPILATIONS["infer"]
# a world forked from the zygote, as ci's report on the pin measured it (world_start_s of the
# worlds of 3, 4 and 1000 simulated ranks: 1.2 to 1.7 s); the first world also starts the zygote
WORLD_START_S = 1.5


def scenario_seconds(row: Mapping[str, Any], scenario: str) -> float:
    """What running ``scenario`` adds to the row's cell (a dict of axes, or a cell's)."""
    if scenario in (DEFAULT_SCENARIO, INFERENCE):
        return 0.0
    kinds = 2 if scenario == "resume" and not COMPOSITIONS[row["composition"]].replicated else 1
    return SCENARIO_COMPILATIONS[scenario] * kinds * fixture_for(row["model"], row.get("spec")).trace_s


def expected_seconds(cell: Cell) -> float:
    """The model's tracing and its scenario's compilations; a world of more processes than a
    pair shares the machine's cores between them (a simulated world runs ``SAMPLED``)."""
    processes, _ = world_of(cell)
    share = INFERENCE_SHARE if cell.scenario == INFERENCE else 1.0
    trace_s = fixture_for(cell.model, cell.spec).trace_s
    own = trace_s * share + scenario_seconds(cell.__dict__, cell.scenario)
    # a resharded resume first trains the cell in a world of ``saved_at`` ranks
    saving = 0.0 if cell.saved_at is None else trace_s * max(1.0, cell.saved_at / 2)
    return own * max(1.0, processes / 2) + saving


def measured_seconds(report_cells: list[dict[str, Any]]) -> dict[str, float]:
    """cell id -> seconds its items took in a report (its ``cells`` list), the world's start
    left out once (every item of the cell names it; the order charges a world's start where
    it changes worlds)."""
    took: dict[str, float] = {}
    start: dict[str, float] = {}
    for item in report_cells:
        if (cell := item.get("cell")) is not None:
            took[cell] = took.get(cell, 0.0) + float(item.get("duration") or 0.0)
            start[cell] = max(start.get(cell, 0.0), float((item.get("metrics") or {}).get("world_start_s") or 0.0))
    return {cell: max(seconds - start[cell], 0.0) for cell, seconds in took.items()}

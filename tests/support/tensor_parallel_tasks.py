"""Rank tasks for tensor parallelism's own tests: a cell of the family driven as the suite
drives it, with the plan's model left uncompiled (eager PyTorch's tensor parallelism in
Thunder's place), so that every derivation the areas hold Thunder to is held to eager first."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from conformance.checks.findings import CellResult, judged
from conformance.checks.registry import AREAS, applies
from conformance.matrix.cells import Cell
from fixtures.compositions import COMPOSITIONS


def eager_in_thunders_place(axes: dict[str, Any]) -> dict[str, Any]:
    """Every area's findings of the cell, with the composition parallelizing the model by its
    plan and compiling nothing."""
    from conformance.rank import tensor_parallel as rank_side
    from fixtures import tensor_parallel
    from fixtures.torch_parallel import UnderTest

    def uncompiled(module: Any, how: Any) -> UnderTest:
        mesh = tensor_parallel.mesh(how.device, how.process_group)
        model = tensor_parallel.parallelize(module, mesh, how.tp_plan)
        return UnderTest(model, model, None, mesh=mesh)

    cell = Cell(**axes)
    composition = COMPOSITIONS[cell.composition]
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(COMPOSITIONS, cell.composition, dataclasses.replace(composition, build=uncompiled))
        run = rank_side.drive(cell)
    areas = [area for name, area in AREAS.items() if applies(cell, name)]
    return CellResult({area.name: judged(area.tensor_parallel, run) for area in areas}, run.timings).to_json()

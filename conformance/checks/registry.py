"""Every check area, in the order a cell's areas are judged and reported. Adding an area is
one module exposing ``AREA`` and one line here (and its ``conformance/test_<area>.py``)."""

from __future__ import annotations

from conformance.checks import (
    collectives,
    compiled,
    materialization,
    memory,
    numerics,
    offload,
    schedule,
    sharding,
    state_dict,
)
from conformance.checks.area import Area
from conformance.matrix.cells import Cell
from conformance.matrix.initialization import expects_reset_error
from fixtures.compositions import COMPOSITIONS

AREAS: dict[str, Area] = {
    area.name: area
    for area in (
        materialization.AREA,
        numerics.AREA,
        collectives.AREA,
        schedule.AREA,
        state_dict.AREA,
        memory.AREA,
        offload.AREA,
        sharding.AREA,
        compiled.AREA,
    )
}


def applies(cell: Cell, name: str) -> bool:
    """Whether area ``name`` judges ``cell``: a negative cell never gets a model to train, so
    only the areas that judge a refusal apply to it; a simulated world moves no data, so only
    the areas that judge what a rank holds and traces by itself; a tensor-parallel cell only
    the areas with a judgment of that family; a hybrid-sharded one the areas that judge hybrid
    meshes; an area judges the compositions of the
    parallelisms it names."""
    area = AREAS[name]
    if cell.simulated:
        return area.simulated is not None
    if expects_reset_error(cell):
        return area.refusal is not None
    if COMPOSITIONS[cell.composition].parallelism == "tensor":
        return area.tensor_parallel is not None
    if COMPOSITIONS[cell.composition].hybrid and not area.hybrid:
        return False
    if COMPOSITIONS[cell.composition].parallelism not in area.parallelisms:
        return False
    return area.check is not None and area.applies(cell)

"""The interface every check area offers: a name, the cells it applies to, and a check of a
cell's record. An area that also judges negative cells (Thunder must refuse the model),
or the sampled ranks of a simulated world, says how."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from conformance.checks.findings import Findings
from conformance.checks.record import CellRecord, SimulatedRecord
from conformance.matrix.cells import Cell


def every_cell(cell: Cell) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Area:
    name: str
    # its check of a cell that trained (None: the area judges simulated worlds only)
    check: Callable[[CellRecord], Findings] | None
    # which cells that train it applies to
    applies: Callable[[Cell], bool] = every_cell
    # its check of one sampled rank of a simulated world (None: the area needs data to move)
    simulated: Callable[[SimulatedRecord], Findings] | None = None
    # how it judges a negative cell, given what setup raised (None: setup succeeded); an
    # area without it does not apply to negative cells, which never get a model to train
    refusal: Callable[[Cell, BaseException | None], Findings] | None = None

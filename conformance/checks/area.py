"""The interface every check area offers: a name, the cells it applies to, and a check of a
cell's record. An area that also judges negative cells (Thunder must refuse the model)
says how."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from conformance.checks.findings import Findings
from conformance.checks.record import CellRecord
from conformance.matrix.cells import Cell


def every_cell(cell: Cell) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Area:
    name: str
    check: Callable[[CellRecord], Findings]
    # which cells that train it applies to
    applies: Callable[[Cell], bool] = every_cell
    # how it judges a negative cell, given what setup raised (None: setup succeeded); an
    # area without it does not apply to negative cells, which never get a model to train
    refusal: Callable[[Cell, BaseException | None], Findings] | None = None

"""The interface every check area offers: a name, the cells it applies to, and a check of a
cell's record. An area that also judges negative cells (Thunder must refuse the model), the
sampled ranks of a simulated world, the ranks of one world against each other, or a cell
against an earlier run of it, says how: the front end holds every area to account through
these hooks alone and never names one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Protocol

from conformance.checks.findings import Failure, Findings
from conformance.checks.record import CellRecord, SimulatedRecord, TensorParallelRecord
from conformance.matrix.cells import Cell


def every_cell(cell: Cell) -> bool:
    return True


class Noise(Protocol):
    """How much a metric moves between two runs of the same code (reports/noise.py's)."""

    def beyond(self, old: float, new: float) -> bool: ...

    def describe(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Across:
    """A failure that only comparing the ranks of one world shows, and the ranks it names."""

    failure: Failure
    ranks: list[int]


@dataclasses.dataclass(frozen=True)
class Area:
    name: str
    # its check of a cell that trained (None: the area judges simulated worlds only)
    check: Callable[[CellRecord], Findings] | None
    # which cells that train it applies to
    applies: Callable[[Cell], bool] = every_cell
    # whose parallelism it judges (``Composition.parallelism``): Thunder's own transforms, and
    # "torch" only where it reads nothing but what every composition records (its record's
    # Thunder-specific parts are absent there)
    parallelisms: frozenset[str] = frozenset({"thunder"})
    # its check of one sampled rank of a simulated world (None: the area needs data to move)
    simulated: Callable[[SimulatedRecord], Findings] | None = None
    # whether it judges hybrid sharding's cells (``Composition.hybrid``: FSDP within each row of
    # a 2-D mesh, DDP across): what it derives holds for shards over a row, not the world
    hybrid: bool = False
    # its check of a tensor-parallel cell's record (parallelism "tensor": every rank on the same
    # batch, the model split by a plan; None: the area does not judge that family)
    tensor_parallel: Callable[[TensorParallelRecord], Findings] | None = None
    # how it judges a negative cell, given what setup raised (None: setup succeeded); an
    # area without it does not apply to negative cells, which never get a model to train
    refusal: Callable[[Cell, BaseException | None], Findings] | None = None
    # its judgment of the ranks of one world against each other, given each rank's name and
    # findings (those whose check raised left out): what no rank can see alone
    across_ranks: Callable[[list[int], list[Findings]], list[Across]] | None = None
    # its judgment of a cell against an earlier run of it (--baseline): that run's metrics of
    # this area (name -> number), the first rank's findings now, and the run-to-run noise of
    # a metric by name
    against_baseline: Callable[[Mapping[str, float], Findings, Callable[[str], Noise]], list[Failure]] | None = None
    # metrics too long to repeat for every sampled rank of a simulated world in the report
    # (the first rank's stands for them, a digest of each beside it)
    per_rank_omits: frozenset[str] = frozenset()

"""Cells: points of the matrix, named so that a cell's pytest id spells every axis.

The controller imports this module, so it reads the registries of models, init modes and
compositions without importing Thunder (they import it only when a rank builds a cell).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

from conformance.compose import COMPOSITIONS
from fixtures.inits import INITS
from fixtures.models import MODELS

# Axis order is the order of the id's parts.
AXES = ("model", "init", "composition", "tie", "offload", "sharding", "bucketing", "dtype", "world_size")


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str
    init: str
    composition: str
    tie: str = "untied"
    offload: str = "none"
    sharding: str = "zero2"
    bucketing: str = "none"
    dtype: str = "float32"
    world_size: int = 2

    @property
    def id(self) -> str:
        parts = [str(getattr(self, axis)) for axis in AXES]
        parts[-1] = f"ws{self.world_size}"
        return "-".join(parts)

    def axes(self) -> dict[str, str | int]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return self.id


def matrix(world_size: int) -> Iterator[Cell]:
    """The cells of the foundation matrix: every model, tie, init and composition."""
    for model in MODELS.values():
        for tie, init, composition in itertools.product(model.ties, INITS, COMPOSITIONS):
            yield Cell(model=model.name, init=init, composition=composition, tie=tie, world_size=world_size)

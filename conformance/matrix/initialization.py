"""What a cell plans to do at setup, from its axes alone: how MaterializationTransform
initializes the model, which state dict is loaded after composing, and whether Thunder must
refuse the model (a negative cell)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from conformance.matrix.cells import Cell
from fixtures.compositions import COMPOSITIONS
from fixtures.inits import INITS
from fixtures.models import fixture_for

StateDictKind = Literal["original", "transformed"]


@dataclasses.dataclass(frozen=True)
class SetupPlan:
    # how MaterializationTransform initializes: each module's reset_parameters ("module"),
    # or from the eager model's state dict, unsharded ("original") or sharded ("transformed")
    materialize: Literal["module"] | StateDictKind
    # the state dict loaded after composing, where the composition cannot take it as its
    # materialization init (it then materializes through module init first)
    load_after: StateDictKind | None = None

    @property
    def handed_over(self) -> StateDictKind | None:
        """Which state dict the kit hands Thunder, either way (at most one of the two)."""
        return self.load_after or (None if self.materialize == "module" else self.materialize)


def plan(cell: Cell) -> SetupPlan:
    init = INITS[cell.init]
    if init.state_dict is None:
        return SetupPlan("module")
    if COMPOSITIONS[cell.composition].takes_materialization_init and not init.load_after:
        return SetupPlan(init.state_dict)
    return SetupPlan("module", load_after=init.state_dict)


def expects_reset_error(cell: Cell) -> bool:
    """A model lacking reset_parameters, materialized through module init: Thunder must
    refuse with a TypeError naming the module (a negative cell)."""
    lacks_reset = fixture_for(cell.model, cell.spec).lacks_reset
    return bool(lacks_reset) and INITS[cell.init].on_meta and plan(cell).materialize == "module"

"""Cells: points of the matrix, named so that a cell's pytest id spells every axis, and the
profiles that choose which cells a run covers.

The controller imports this module, so it reads the registries of models, init modes and
compositions without importing Thunder (they import it only when a rank builds a cell).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Iterator
from typing import Any

from conformance.compose import COMPOSITIONS
from fixtures.inits import INITS
from fixtures.models import MODELS, fixture_for
from fixtures.offloads import POLICIES

# Axis order is the order of the id's parts.
AXES = ("model", "init", "composition", "tie", "offload", "sharding", "bucketing", "dtype", "world_size")
AREAS = ("materialization", "numerics", "collectives", "state_dict", "memory", "offload")
PROFILES = ("smoke", "ci", "full")


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
    spec: str | None = None  # JSON structure of a generated model (fixtures/strategies.py)

    @property
    def id(self) -> str:
        parts = [str(getattr(self, axis)) for axis in AXES]
        parts[-1] = f"ws{self.world_size}"
        if self.spec is not None:
            parts.append(hashlib.sha1(self.spec.encode()).hexdigest()[:8])
        return "-".join(parts)

    def axes(self) -> dict[str, str | int]:
        """The cell as JSON-able keyword arguments (a generated model's spec included)."""
        out = dataclasses.asdict(self)
        if self.spec is None:
            del out["spec"]
        return out

    def __str__(self) -> str:
        return self.id


def plan(cell: Cell) -> tuple[str, str | None]:
    """(how MaterializationTransform initializes, which state dict is loaded after composing).

    The first is "module" (each module's reset_parameters), "original" or "transformed".
    """
    init = INITS[cell.init]
    if init.state_dict is None:
        return "module", None
    if COMPOSITIONS[cell.composition].takes_materialization_init and not init.load_after:
        return init.state_dict, None
    return "module", init.state_dict


def expects_reset_error(cell: Cell) -> bool:
    """A model lacking reset_parameters, materialized through module init: Thunder must
    refuse with a TypeError naming the module (a negative cell)."""
    lacks_reset = fixture_for(cell.model, cell.spec).lacks_reset
    return bool(lacks_reset) and INITS[cell.init].on_meta and plan(cell)[0] == "module"


def applies(cell: Cell, area: str) -> bool:
    """A negative cell never gets a model to train: only its materialization is checked.
    Offloading is checked where the cell offloads."""
    if area == "offload" and cell.offload == "none":
        return False
    return area == "materialization" or not expects_reset_error(cell)


def valid(row: dict[str, Any]) -> bool:
    """Combinations that cannot exist: a tie the model does not offer, an init mode the
    composition cannot express."""
    if "model" in row and "tie" in row and row["tie"] not in MODELS[row["model"]].ties:
        return False
    if "composition" in row and "init" in row:
        inits = COMPOSITIONS[row["composition"]].inits
        if inits is not None and row["init"] not in inits:
            return False
    return True


def axis_values(world_size: int) -> dict[str, list[Any]]:
    return {
        "model": list(MODELS),
        "init": list(INITS),
        "composition": list(COMPOSITIONS),
        "tie": ["tied", "untied"],
        "offload": list(POLICIES),
        "sharding": ["zero2", "zero3"],
        "bucketing": ["none", "layer", "block"],
        "dtype": ["float32", "bfloat16"],
        "world_size": [world_size],
    }


def _full(world_size: int) -> Iterator[Cell]:
    values = axis_values(world_size)
    for combo in itertools.product(*(values[a] for a in AXES)):
        row = dict(zip(AXES, combo, strict=True))
        if valid(row):
            yield Cell(**row)


def _pairwise(world_size: int) -> Iterator[Cell]:
    """A covering array: every pair of values of any two axes meets in some cell."""
    from covertable import make

    constraint = {"operator": "fn", "requires": ["model", "tie", "composition", "init"], "evaluate": valid}
    for row in make(axis_values(world_size), strength=2, constraints=[constraint]):
        yield Cell(**row)


def _smoke(world_size: int) -> Iterator[Cell]:
    """One cell per kind of check: plain, tied and meta and offloaded, negative, a probed
    composition."""
    yield Cell("mlp", "real", "fsdp_jit", world_size=world_size)
    yield Cell("tied_lm", "meta_module_init", "jit_fsdp", tie="tied", offload="all", world_size=world_size)
    yield Cell("no_reset", "meta_module_init", "fsdp_jit", world_size=world_size)
    yield Cell("mlp", "real", "legacy_jit_fsdp", world_size=world_size)


def cells(profile: str, world_size: int) -> list[Cell]:
    generate = {"smoke": _smoke, "ci": _pairwise, "full": _full}[profile]
    return list(dict.fromkeys(generate(world_size)))


def coverage(selected: list[Cell]) -> dict[str, dict[str, int]]:
    """How many cells each value of each axis got."""
    counts: dict[str, dict[str, int]] = {a: {} for a in AXES}
    for cell in selected:
        for axis in AXES:
            value = str(getattr(cell, axis))
            counts[axis][value] = counts[axis].get(value, 0) + 1
    return counts

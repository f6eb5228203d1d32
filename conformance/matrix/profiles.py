"""Profiles: which cells a run covers. ``full`` is the whole product of the axes under the
constraints, ``ci`` a pairwise covering array of it, ``smoke`` one cell per kind of check."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from conformance.matrix.cells import AXES, Cell
from fixtures.compositions import COMPOSITIONS
from fixtures.inits import INITS
from fixtures.models import MODELS
from fixtures.offloads import POLICIES
from fixtures.options import BUCKETINGS, DTYPES, SHARDINGS, TIES

PROFILES = ("smoke", "ci", "full")


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
        "tie": list(TIES),
        "offload": list(POLICIES),
        "sharding": list(SHARDINGS),
        "bucketing": list(BUCKETINGS),
        "dtype": list(DTYPES),
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

"""Profiles: which cells a run covers. ``full`` is the whole product of the axes under the
constraints, ``ci`` a pairwise covering array of it, ``smoke`` one cell per kind of check.

The covering array is built over the compositions that the Thunder under test offers (the
worlds probe them first): a pair of values that met only in a cell reported unsupported
would never run. Each unsupported composition keeps one cell, which reports why. Cells at
the boundary world sizes (3 and 4: first dimensions that do not divide, the last rank named
by an option) join ci by hand and full as a covering array of their own.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from conformance.matrix.cells import AXES, Cell
from fixtures.compositions import COMPOSITIONS
from fixtures.inits import INITS
from fixtures.models import MODELS
from fixtures.offloads import POLICIES
from fixtures.options import BUCKETINGS, DTYPES, SHARDINGS, TIES

PROFILES = ("smoke", "ci", "full")
# world sizes beside the session's own: every model (the negative one aside) has a first
# dimension that neither divides (litgpt's vocab 37, tied_lm's 16 and 33, tie_group's 9 and 5, mlp's 7)
BOUNDARY_WORLD_SIZES = (3, 4)


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


def axis_values(world_size: int, unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """Every axis's values; compositions named in ``unsupported`` left out."""
    return {
        "model": list(MODELS),
        "init": list(INITS),
        "composition": [c for c in COMPOSITIONS if c not in unsupported],
        "tie": list(TIES),
        "offload": list(POLICIES),
        "sharding": list(SHARDINGS),
        "bucketing": list(BUCKETINGS),
        "dtype": list(DTYPES),
        "world_size": [world_size],
    }


def _full(values: dict[str, list[Any]]) -> Iterator[Cell]:
    for combo in itertools.product(*(values[a] for a in AXES)):
        row = dict(zip(AXES, combo, strict=True))
        if valid(row):
            yield Cell(**row)


def _pairwise(values: dict[str, list[Any]]) -> Iterator[Cell]:
    """A covering array: every pair of values of any two axes meets in some cell."""
    from covertable import make

    constraint = {"operator": "fn", "requires": ["model", "tie", "composition", "init"], "evaluate": valid}
    for row in make(values, strength=2, constraints=[constraint]):
        yield Cell(**row)


def _smoke(world_size: int) -> Iterator[Cell]:
    """One cell per kind of check: plain, tied and meta and offloaded, negative, a probed
    composition."""
    yield Cell("mlp", "real", "fsdp_jit", world_size=world_size)
    yield Cell("tied_lm", "meta_module_init", "jit_fsdp", tie="tied", offload="all", world_size=world_size)
    yield Cell("no_reset", "meta_module_init", "fsdp_jit", world_size=world_size)
    yield Cell("mlp", "real", "legacy_jit_fsdp", world_size=world_size)


# ci's cells at the boundary world sizes: models with a first dimension the world size does
# not divide (litgpt's 37 and tied_lm's 16 at 3; 7, 9 and 33 at 4), ZERO3, a broadcast from
# the first and from the last rank, and the state dict the kit shards itself (padded) at each
# size. Small models but one: a world of 4 ranks on 2 cores is slow.
BOUNDARY_CI = (
    Cell("tied_lm", "real_broadcast_last", "fsdp_jit", tie="tied", sharding="zero3", world_size=3),
    Cell("litgpt_neox", "meta_transformed_sd", "jit_fsdp", tie="untied", sharding="zero3", world_size=3),
    Cell("mlp", "real_broadcast_first", "jit_fsdp", offload="all", world_size=3),
    Cell("tie_group", "real_broadcast_first", "fsdp_jit", tie="tied", sharding="zero3", world_size=4),
    Cell("mlp", "meta_transformed_sd", "fsdp_jit", sharding="zero3", bucketing="layer", world_size=4),
    Cell("tied_lm", "real_broadcast_last", "jit_fsdp", tie="tied", dtype="bfloat16", world_size=4),
)


def _stand_in(composition: str, world_size: int) -> Cell:
    """The one cell an unsupported composition keeps: it reports why it does not run."""
    model = next(m for m in MODELS.values() if not m.lacks_reset)
    init = next(i for i in INITS if valid({"composition": composition, "init": i}))
    return Cell(model.name, init, composition, tie=model.ties[-1], world_size=world_size)


def cells(profile: str, world_size: int, unsupported: Mapping[str, str]) -> list[Cell]:
    """The profile's cells at the session's world size (and the boundary sizes).
    ``unsupported``: composition -> why the Thunder under test does not offer it, as the
    worlds' probe found."""
    if profile == "smoke":
        return list(dict.fromkeys(_smoke(world_size)))
    runs = axis_values(world_size, unsupported)
    if profile == "ci":
        selected = [*_pairwise(runs), *(c for c in BOUNDARY_CI if c.composition not in unsupported)]
    else:
        others = [n for n in BOUNDARY_WORLD_SIZES if n != world_size]
        selected = [*_full(runs), *(c for n in others for c in _pairwise(axis_values(n, unsupported)))]
    selected += [_stand_in(name, world_size) for name in COMPOSITIONS if name in unsupported]
    return list(dict.fromkeys(selected))


def coverage(ran: Iterable[Cell], world_size: int) -> dict[str, dict[str, int]]:
    """How many of the cells that ran each value of each axis got (0 where none did)."""
    counts = {a: {str(v): 0 for v in values} for a, values in axis_values(world_size).items()}
    for cell in ran:
        for axis in AXES:
            value = str(getattr(cell, axis))
            counts[axis][value] = counts[axis].get(value, 0) + 1
    return counts


def unmet_pairs(ran: Iterable[Cell], world_size: int, unsupported: Collection[str] = ()) -> list[dict[str, Any]]:
    """Every pair of values of two axes (at ``world_size``, compositions in ``unsupported``
    left out) that the constraints allow but that met in none of the cells that ran, as
    ``{axis: value, other_axis: value}``."""
    met = set()
    for cell in ran:
        row = [(a, getattr(cell, a)) for a in AXES]
        met.update(itertools.combinations(row, 2))
    values = axis_values(world_size, unsupported)
    unmet = []
    for a, b in itertools.combinations(AXES, 2):
        for va, vb in itertools.product(values[a], values[b]):
            if ((a, va), (b, vb)) not in met and valid({a: va, b: vb}):
                unmet.append({a: va, b: vb})
    return unmet

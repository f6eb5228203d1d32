"""Covering arrays of cells over axis values: the whole product under the constraints, a
covering array of a strength, and ci's array grown by the composition and the scenario."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from conformance.matrix.axes import valid
from conformance.matrix.cells import AXES, DEFAULT_SCENARIO, Cell
from fixtures.compositions import COMPOSITIONS
from fixtures.models import MODELS


def full(values: dict[str, list[Any]]) -> Iterator[Cell]:
    for combo in itertools.product(*(values[a] for a in AXES)):
        row = dict(zip(AXES, combo, strict=True))
        if valid(row):
            yield Cell(**row)


def _rows(values: dict[str, list[Any]], strength: int = 2) -> list[dict[str, Any]]:
    """A covering array: every ``strength`` values of as many axes that the constraints allow
    meet in some row. covertable orders candidates by an FNV hash, never Python's salted
    ``hash``, so the array is the same in every process."""
    from covertable import make

    requires = [a for a in ("model", "tie", "composition", "init") if a in values]
    constraint = {"operator": "fn", "requires": requires, "evaluate": valid}
    return list(make(values, strength=strength, constraints=[constraint]))


def covering(values: dict[str, list[Any]], strength: int = 2) -> Iterator[Cell]:
    for row in _rows(values, strength):
        yield Cell(**row)


def grown(values: dict[str, list[Any]]) -> Iterator[Cell]:
    """ci's array: pairwise over every axis but the composition and the scenario, then grown
    by each in turn (conformance/matrix/growth.py). A composition costs a cell nothing more,
    so DDP's take rows of the array (those at FSDP's default sharding: it does not apply to
    them) instead of an array of their own; a scenario beyond training compiles again, so each
    lands on the cells whose second compilation costs least for the pairs it meets. (An
    array of covertable's over every axis would be far larger and slower to run.)"""
    from conformance.matrix.growth import grow

    rest = {a: v for a, v in values.items() if a not in ("composition", "scenario")}
    rows = _rows(rest)
    first, *others = values["composition"]
    # DDP's first: they fit fewer rows (FSDP's default sharding, the inits they express);
    # the first composition takes the rows no other needed
    served = [first, *sorted(others, key=lambda c: not COMPOSITIONS[c].replicated)]
    rows = grow(rows, "composition", served, rest, valid, lambda row, composition: 0.0)
    rest["composition"] = values["composition"]
    # the costliest scenario first: it gets the cheapest carriers (a checkpoint of DDP's, one
    # fresh composition where FSDP's takes two)
    beyond = [s for s in values["scenario"] if s != DEFAULT_SCENARIO]
    scenarios = [DEFAULT_SCENARIO, *sorted(beyond, key=lambda s: -SCENARIO_COMPILATIONS[s])]
    for row in grow(rows, "scenario", scenarios, rest, valid, _scenario_cost):
        yield Cell(**row)


# about how many compilations of the cell's model a scenario adds: a forward alone for
# no_grad, a no_sync forward and backward, a second shape's, and a fresh composition for each
# checkpoint kind (full; sharded too where parameters are: conformance/rank/scenarios/resume.py)
SCENARIO_COMPILATIONS = {"infer": 0.6, "accumulate": 1.0, "reshape": 1.0, "resume": 1.0}


def _scenario_cost(row: dict[str, Any], scenario: str) -> float:
    if scenario == DEFAULT_SCENARIO:
        return 0.0
    kinds = 2 if scenario == "resume" and not COMPOSITIONS[row["composition"]].replicated else 1
    return SCENARIO_COMPILATIONS[scenario] * kinds * MODELS[row["model"]].trace_s

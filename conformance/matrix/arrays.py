"""Covering arrays of cells over axis values: the whole product under the constraints, a
covering array of a strength, and ci's array grown by the composition and the scenario."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from conformance.matrix.axes import valid
from conformance.matrix.cells import AXES, DEFAULT_SCENARIO, Cell
from conformance.matrix.cost import SCENARIO_COMPILATIONS, scenario_seconds
from fixtures.compositions import COMPOSITIONS
from fixtures.models import MODELS

# (composition, executors) pairs the worlds' probe refused (``fixtures.compositions.pairing``):
# the plugins API's default recipe where Thunder has no nvFuser. Every array leaves them out, as
# ``valid`` leaves out what cannot exist anywhere; each keeps a stand-in (profiles.py).
Refused = frozenset[tuple[str, str]]


def allowed(refused: Refused = frozenset()) -> Callable[[dict[str, Any]], bool]:
    """``valid``, and no refused pair of a composition and an executors value."""
    if not refused:
        return valid

    def ok(row: dict[str, Any]) -> bool:
        paired = "composition" in row and "executors" in row
        return valid(row) and not (paired and (row["composition"], row["executors"]) in refused)

    return ok


def full(values: dict[str, list[Any]], refused: Refused = frozenset()) -> Iterator[Cell]:
    ok = allowed(refused)
    axes = [a for a in AXES if a in values]  # an axis left out stays at its default
    for combo in itertools.product(*(values[a] for a in axes)):
        row = dict(zip(axes, combo, strict=True))
        if ok(row):
            yield Cell(**row)


def _rows(values: dict[str, list[Any]], strength: int = 2) -> list[dict[str, Any]]:
    """A covering array: every ``strength`` values of as many axes that the constraints allow
    meet in some row. covertable orders candidates by an FNV hash, never Python's salted
    ``hash``, so the array is the same in every process."""
    from covertable import make

    requires = [a for a in ("model", "tie", "composition", "init") if a in values]
    constraint = {"operator": "fn", "requires": requires, "evaluate": valid}
    return list(make(values, strength=strength, constraints=[constraint]))


def covering(values: dict[str, list[Any]], strength: int = 2, refused: Refused = frozenset()) -> Iterator[Cell]:
    for row in _rows(values, strength):
        for kept in _repaired(row, values, refused):
            yield Cell(**kept)


def _repaired(row: dict[str, Any], values: dict[str, list[Any]], refused: Refused) -> list[dict[str, Any]]:
    """``row``, or where it holds a refused pair, two rows in its place: one with another
    executors value, one with another composition. Every combination of the row's values that
    is not the refused pair itself stays met, at any strength. (A constraint over the pair
    made covertable's strength-3 array take more than 15 minutes instead of half of one.)"""
    if (row.get("composition"), row.get("executors")) not in refused:
        return [row]
    ok = allowed(refused)
    fixes = [
        next((r for v in values[axis] if ok(r := {**row, axis: v})), None) for axis in ("executors", "composition")
    ]
    return [r for r in fixes if r is not None]


def grown(values: dict[str, list[Any]], contract: bool = True, refused: Refused = frozenset()) -> Iterator[Cell]:
    """ci's array: pairwise over every axis but the composition and the scenario, then grown
    by each in turn (conformance/matrix/growth.py). A composition costs a cell nothing more,
    so DDP's take rows of the array (those at FSDP's default sharding: it does not apply to
    them) instead of an array of their own; a scenario beyond training compiles again, so each
    lands on the cells whose second compilation costs least for the pairs it meets. (An
    array of covertable's over every axis would be far larger and slower to run.) Then the
    coverage contract is met (``contract``; without it, the pairwise array alone)."""
    from conformance.matrix.growth import grow

    ok = allowed(refused)
    rest = {a: v for a, v in values.items() if a not in ("composition", "scenario")}
    rows = _rows(rest)
    first, *others = values["composition"]
    # DDP's first: they fit fewer rows (FSDP's default sharding, the inits they express);
    # the first composition takes the rows no other needed
    served = [first, *sorted(others, key=lambda c: not COMPOSITIONS[c].replicated)]
    rows = grow(rows, "composition", served, rest, ok, lambda row, composition: 0.0)
    rest["composition"] = values["composition"]
    # the costliest scenario first: it gets the cheapest carriers (a checkpoint of DDP's, one
    # fresh composition where FSDP's takes two)
    beyond = [s for s in values["scenario"] if s != DEFAULT_SCENARIO]
    scenarios = [DEFAULT_SCENARIO, *sorted(beyond, key=lambda s: -SCENARIO_COMPILATIONS[s])]
    rows = grow(rows, "scenario", scenarios, rest, ok, scenario_seconds)
    for row in _topped_up(rows, values, ok) if contract else rows:
        yield Cell(**row)


def _topped_up(
    rows: list[dict[str, Any]], values: dict[str, list[Any]], valid: Callable[[dict[str, Any]], bool] = valid
) -> list[dict[str, Any]]:
    """The grown array with the coverage contract met (conformance/matrix/contract.py): rows
    change their scenario or composition where every pair stays met, or a row is added, the
    cheapest way first; then rows nothing needs any more go."""
    from conformance.matrix.contract import contracted, family, items_of
    from conformance.matrix.features import FEATURES, features
    from conformance.matrix.growth import top_up

    axes = [a for a in AXES if a in values]
    pairs = frozenset(
        p
        for a, b in itertools.combinations(axes, 2)
        for p in (((a, x), (b, y)) for x in values[a] for y in values[b])
        if valid(dict(p))
    )

    def meets(row: dict[str, Any]) -> frozenset:
        return frozenset(itertools.combinations([(a, row[a]) for a in axes], 2)) | items_of(row)

    def changes(row: dict[str, Any]) -> list[dict[str, Any]]:
        out = ({**row, "scenario": s, "composition": c} for s in values["scenario"] for c in values["composition"])
        return [r for r in out if r != row and valid(r)]

    # the models (and ties) that have each feature: a row made to meet an item takes one
    having = {
        (f, ws): [
            {"model": m, "tie": t}
            for m in values["model"]
            for t in values["tie"]
            if valid({"model": m, "tie": t}) and f in features(m, t, ws)
        ]
        for f in FEATURES
        for ws in values["world_size"]
    }

    def additions(item: tuple, row: dict[str, Any]) -> list[dict[str, Any]]:
        if not isinstance(item[0], tuple) or item[0][0] != "feature":
            return []  # a pair: the array met it already
        want = dict(item)
        ws = row["world_size"]
        models = [{}] if want["feature"] in features(row["model"], row["tie"], ws) else having[want["feature"], ws]
        fixed = {a: want[a] for a in ("scenario", "init") if a in want}
        comps = [{}]
        if "family" in want and family(row["composition"]) != want["family"]:
            comps = [{"composition": c} for c in values["composition"] if family(c) == want["family"]]
        out = ({**row, **m, **c, **fixed} for m in models for c in comps)
        return [r for r in out if valid(r)]

    def cost(row: dict[str, Any]) -> float:
        return MODELS[row["model"]].trace_s + scenario_seconds(row, row["scenario"])

    return top_up(rows, meets, pairs | contracted(values), changes, additions, cost)

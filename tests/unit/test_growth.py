"""Growing a pairwise array by one costly axis (conformance/matrix/growth.py), on arrays small
enough to read: every pair met, the free value wherever no pair needs another, costly values
on the cheapest rows that meet their pairs, and rows of their own for what no row can carry."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from conformance.matrix.growth import grow

OTHERS = {"model": ["small", "big"], "dtype": ["f32", "bf16"]}
# a pairwise array over OTHERS (here: the whole product)
ROWS = [{"model": m, "dtype": d} for m, d in itertools.product(*OTHERS.values())]
COST = {"small": 1.0, "big": 10.0}


def cost(row: dict[str, Any], value: str) -> float:
    """Training adds nothing to a row; infer compiles its model again."""
    return COST[row["model"]] * (value != "train")


def pairs_met(rows: list[dict[str, Any]], axes: list[str]) -> set[frozenset]:
    return {frozenset(p) for r in rows for p in itertools.combinations([(a, r[a]) for a in axes], 2)}


def every_pair(values: dict[str, list[Any]], valid) -> set[frozenset]:
    return {
        frozenset([(a, x), (b, y)])
        for a, b in itertools.combinations(values, 2)
        for x in values[a]
        for y in values[b]
        if valid({a: x, b: y})
    }


def test_every_pair_meets_and_the_free_value_fills_the_rest() -> None:
    grown = grow(ROWS, "scenario", ["train", "infer"], OTHERS, lambda r: True, cost)
    values = {**OTHERS, "scenario": ["train", "infer"]}
    assert pairs_met(grown, list(values)) >= every_pair(values, lambda r: True)
    assert [{k: r[k] for k in OTHERS} for r in grown] == ROWS  # the rows keep their order and values
    # infer needs both models and both dtypes: two rows, one of them necessarily big; the
    # other two rows train
    beyond = [r for r in grown if r["scenario"] == "infer"]
    assert len(beyond) == 2 and sorted(r["model"] for r in beyond) == ["big", "small"]


def test_a_costly_value_prefers_the_cheapest_rows_that_meet_its_pairs() -> None:
    # the big model's pair with infer can only land on a big row, which meets a dtype too;
    # infer's other pairs land on one small row, the one that meets both
    rows = [
        *({"model": "small", "dtype": d} for d in ("f32", "bf16", "f32", "bf16")),
        {"model": "big", "dtype": "f32"},
        {"model": "big", "dtype": "bf16"},
    ]
    grown = grow(rows, "scenario", ["train", "infer"], OTHERS, lambda r: True, cost)
    assert [r["scenario"] for r in grown] == ["train", "infer", "train", "train", "infer", "train"]


def test_a_pair_no_row_can_carry_gets_a_row_of_its_own() -> None:
    # only bf16 rows may infer and the big row is f32: the pair (big, infer) needs a row, the
    # cheapest that can carry it copied; the one bf16 row infers, so (bf16, train) needs one too
    def valid(row: dict[str, Any]) -> bool:
        return not (row.get("scenario") == "infer" and row.get("dtype") == "f32")

    rows = [{"model": "small", "dtype": "bf16"}, {"model": "big", "dtype": "f32"}, {"model": "small", "dtype": "f32"}]
    grown = grow(rows, "scenario", ["train", "infer"], OTHERS, valid, cost)
    assert all(valid(r) for r in grown)
    values = {**OTHERS, "scenario": ["train", "infer"]}
    assert pairs_met(grown, list(values)) >= every_pair(values, valid)
    assert grown[3:] == [
        {"model": "big", "dtype": "bf16", "scenario": "infer"},
        {"model": "small", "dtype": "bf16", "scenario": "train"},
    ]


def test_a_row_no_value_fits_is_an_error() -> None:
    with pytest.raises(ValueError, match="no value of scenario fits"):
        grow(ROWS, "scenario", ["train"], OTHERS, lambda r: r.get("model") != "big", lambda r, v: 1.0)


def test_top_up_meets_a_contracted_key_in_place_where_nothing_is_lost_and_drops_what_nothing_needs() -> None:
    from conformance.matrix.growth import top_up

    # every row trains, one of them twice; the contract wants the big model inferring
    rows = [{**r, "scenario": "train"} for r in [*ROWS, ROWS[0]]]
    axes = ["model", "dtype", "scenario"]

    def meets(row: dict[str, Any]) -> frozenset:
        keys = {frozenset(p) for p in itertools.combinations([(a, row[a]) for a in axes], 2)}
        return frozenset(keys | ({"big infers"} if row["model"] == "big" and row["scenario"] == "infer" else set()))

    wanted = frozenset().union(*map(meets, rows)) | {"big infers"}

    def changes(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**row, "scenario": "infer"}] if row["scenario"] == "train" else []

    def additions(key: Any, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**row, "model": "big", "scenario": "infer"}]

    def cost(row: dict[str, Any]) -> float:
        return COST[row["model"]] * (1 + (row["scenario"] != "train"))

    topped = top_up(rows, meets, wanted, changes, additions, cost)
    assert frozenset().union(*map(meets, topped)) >= wanted
    # a big row infers in place (the other big row still trains with the big model, the small
    # rows with each dtype), no row is added, and the repeated row goes
    assert sorted((r["model"], r["scenario"]) for r in topped) == [
        ("big", "infer"),
        ("big", "train"),
        ("small", "train"),
        ("small", "train"),
    ]

"""Growing a pairwise covering array by one axis whose values beyond the first may cost a
row something (a scenario beyond training compiles the row's model again): in parameter order
(Lei and Tai's IPO strategy), the rows keep their other values; each value after the first is
given rows until its pairs are met, a greedy set cover that serves first the pair whose
cheapest row costs most and gives it the row that meets the most unmet pairs for what it costs
(a litgpt model's pair can only land on a litgpt cell, which then meets what it can of the
rest); the other rows take the first value that fits; a pair still unmet then gets a row of
its own (a copy of the cheapest row that can carry it), rows made so carrying several such
pairs where they fit.

ci grows its array by the composition and then the scenario axis this way rather than asking
covertable for one over every axis: where a scenario lands decides what ci costs, and
covertable cannot be told that (its array over every axis was 148 cells and ~470 s here)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Row = dict[str, Any]


def grow(
    rows: Sequence[Row],
    axis: str,
    values: Sequence[Any],
    others: Mapping[str, Sequence[Any]],
    valid: Callable[[Row], bool],
    cost: Callable[[Row, Any], float],
) -> list[Row]:
    """``rows`` (a pairwise covering array over ``others``) with ``axis`` added, so that every
    pair of a value of ``axis`` and a value of another axis that ``valid`` allows meets in
    some row. ``cost(row, value)``: what giving ``row`` that value adds (a scenario beyond
    training: one more compilation of the row's model; a composition: nothing). Values are
    served in order from the second on; rows none of them took take the first value that fits
    (training). Rows come back in their order, the rows vertical growth added after them."""
    unmet = {
        (other, value, new)
        for other, choices in others.items()
        if other != axis
        for value in choices
        for new in values
        if valid({other: value, axis: new})
    }
    names = [o for o in others if o != axis]

    def meets(row: Row, new: Any) -> set[tuple[str, Any, Any]]:
        return {(o, row[o], new) for o in names} & unmet

    grown: list[Row | None] = [None] * len(rows)

    def carriers(other: str, value: Any, new: Any) -> list[int]:
        """The free rows that can carry the pair at no more than twice what its cheapest row
        would: past that, a copy of the cheapest (vertical growth, below) costs less."""
        able = [i for i, r in enumerate(rows) if r[other] == value and valid({**r, axis: new})]
        floor = min((cost(rows[i], new) for i in able), default=0.0)
        return [i for i in able if grown[i] is None and cost(rows[i], new) <= 2 * floor]

    for new in values[1:]:
        while True:
            # the unmet pair whose cheapest carrier costs most goes first (a litgpt model's
            # pair can only land on a litgpt cell: that cell then meets what it can of the
            # rest), fewest carriers first among equals; its carrier is the one that meets
            # the most unmet pairs for what it costs
            options = [(o, v, carriers(o, v, new)) for o, v, n in unmet if n == new]
            options = [(o, v, c) for o, v, c in options if c]
            if not options:
                break
            _, _, chosen = max(
                options,
                key=lambda p: (min(cost(rows[i], new) for i in p[2]), -len(p[2]), str(p[0]), str(p[1])),
            )
            i = max(chosen, key=lambda i: (len(meets(rows[i], new)) / max(cost(rows[i], new), 1e-9), -i))
            grown[i] = {**rows[i], axis: new}
            unmet -= meets(rows[i], new)
    for i, row in enumerate(rows):
        if grown[i] is None:
            fits = [v for v in values if valid({**row, axis: v})]
            if not fits:
                raise ValueError(f"no value of {axis} fits the row {row}")
            grown[i] = {**row, axis: fits[0]}
            unmet -= meets(row, fits[0])

    # vertical growth: what no existing row could meet
    cheapest = sorted(rows, key=lambda r: max(cost(r, v) for v in values))
    added: list[tuple[Row, set[str]]] = []
    for other, value, new in sorted(unmet, key=lambda p: (names.index(p[0]), str(p[1]), values.index(p[2]))):
        home = next(
            (
                (row, pinned)
                for row, pinned in added
                if row[axis] == new and other not in pinned and valid({**row, other: value})
            ),
            None,
        )
        if home is not None:
            home[0][other] = value
            home[1].add(other)
            continue
        base = next((r for r in cheapest if valid({**r, other: value, axis: new})), None)
        if base is None:
            raise ValueError(f"no row can carry {other}={value!r} with {axis}={new!r}")
        added.append(({**base, other: value, axis: new}, {other, axis}))
    return [*(r for r in grown if r is not None), *(row for row, _ in added)]


Key = Any


def top_up(
    rows: Sequence[Row],
    meets: Callable[[Row], frozenset[Key]],
    wanted: frozenset[Key],
    changes: Callable[[Row], list[Row]],
    additions: Callable[[Key, Row], list[Row]],
    cost: Callable[[Row], float],
) -> list[Row]:
    """``rows`` with every key of ``wanted`` that some candidate meets met, at a greedy least
    cost, and then without the rows nothing needs. ``meets(row)``: the keys a row meets (its
    pairs of values, the contract's items); ``changes(row)``: the row with a free axis changed
    (its scenario, its composition), each a candidate that takes the row's place where every
    key the row alone met stays met; ``additions(key, row)``: new rows that meet ``key``, made
    from ``row``. Each step takes the candidate that meets the most unmet keys for what it
    adds to ``cost``; then the rows whose every key another row meets too go, costliest first
    (the contract's rows can make pairwise ones redundant)."""
    rows = [dict(r) for r in rows]
    met = [meets(r) & wanted for r in rows]
    counts: dict[Key, int] = {}
    for keys in met:
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
    unmet = {k for k in wanted if k not in counts}

    def account(keys: frozenset[Key], step: int) -> None:
        for k in keys:
            counts[k] = counts.get(k, 0) + step
            if counts[k]:
                unmet.discard(k)
            else:
                del counts[k]
                unmet.add(k)

    while unmet:
        best: tuple[float, int, Row, frozenset[Key]] | None = None  # (score, row or -1, candidate, keys)
        for i, row in enumerate(rows):
            alone = {k for k in met[i] if counts[k] == 1}
            for changed in changes(row):
                keys = meets(changed) & wanted
                gain = len(keys & unmet)
                if gain and alone <= keys:
                    score = gain / max(cost(changed) - cost(row), 1e-3)
                    if best is None or score > best[0]:
                        best = (score, i, changed, keys)
        for key in sorted(unmet, key=str):
            for row in rows:
                for added in additions(key, row):
                    keys = meets(added) & wanted
                    score = len(keys & unmet) / max(cost(added), 1e-3)
                    if key in keys and (best is None or score > best[0]):
                        best = (score, -1, added, keys)
        if best is None:
            break  # what no candidate meets stays unmet (the caller's contract says so)
        _, i, row, keys = best
        if i < 0:
            rows.append(row)
            met.append(keys)
        else:
            account(met[i], -1)
            rows[i], met[i] = row, keys
        account(keys, +1)

    for i in sorted(range(len(rows)), key=lambda i: -cost(rows[i])):
        if all(counts[k] > 1 for k in met[i]):
            account(met[i], -1)
            met[i] = frozenset()
            rows[i] = {}
    return [r for r in rows if r]

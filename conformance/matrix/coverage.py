"""What the cells that ran covered: how many got each value of each axis, and the
combinations of values the constraints allow that met in none of them."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable
from typing import Any

from conformance.matrix.axes import axis_values, pairwise_values, valid
from conformance.matrix.cells import AXES, Cell
from fixtures.compositions import pairing


def coverage(ran: Iterable[Cell], world_size: int) -> dict[str, dict[str, int]]:
    """How many of the cells that ran each value of each axis got (0 where none did)."""
    counts = {a: {str(v): 0 for v in values} for a, values in axis_values(world_size).items()}
    for cell in ran:
        for axis in AXES:
            value = str(getattr(cell, axis))
            counts[axis][value] = counts[axis].get(value, 0) + 1
    return counts


def unmet_pairs(
    ran: Iterable[Cell], world_size: int, unsupported: Collection[str] = (), profile: str = "full"
) -> list[dict[str, Any]]:
    """Every pair of values of two axes (at ``world_size``, over the values ``profile``
    promises pairs of, those in ``unsupported`` left out) that the constraints allow but that
    met in none of the cells that ran, as ``{axis: value, other_axis: value}``."""
    return unmet_combinations(ran, world_size, unsupported, strength=2, profile=profile)


def unmet_combinations(
    ran: Iterable[Cell], world_size: int, unsupported: Collection[str] = (), strength: int = 2, profile: str = "full"
) -> list[dict[str, Any]]:
    """Every combination of values of ``strength`` axes that the constraints allow but that
    met in none of the cells that ran, as ``{axis: value, ...}``. (The constraints tie two
    axes each, so a combination they allow always extends to a whole cell.)"""
    met = set()
    for cell in ran:
        row = [(a, getattr(cell, a)) for a in AXES]  # ordered as the combinations below
        met.update(itertools.combinations(row, strength))
    values = pairwise_values(profile, world_size, unsupported)
    unmet = []
    for axes in itertools.combinations([a for a in AXES if a in values], strength):
        for combo in itertools.product(*(values[a] for a in axes)):
            pairs = tuple(zip(axes, combo, strict=True))
            if pairs not in met and valid(dict(pairs)) and not _refused(dict(pairs), unsupported):
                unmet.append(dict(pairs))
    return unmet


def _refused(combination: dict[str, Any], unsupported: Collection[str]) -> bool:
    """A composition and executors value the probe refused as a pair (``pairing``): no cell can run them."""
    both = "composition" in combination and "executors" in combination
    return both and pairing(combination["composition"], combination["executors"]) in unsupported

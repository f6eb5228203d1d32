"""ci's coverage contract: the combinations a regression nearly always needs, met in some cell.

A distributed regression usually needs three things together: something the model has (a
*feature*, conformance/matrix/features.py), the transform family that mishandles it (FSDP or
DDP) and what is done with the module (the scenario). A pairwise array over model names
does not see features: a model stands for a bundle of them, and the bundle meets each
scenario under one family only. So ci promises, beside every pair of axis values:

- every (feature, family, scenario) that some allowed cell has;
- every (feature, init) where the init treats the feature specially (``SPECIAL_INITS``).

Its generator meets them (``arrays.grown``: a greedy top-up over the pairwise array), and a
run reports what its cells left unmet beside the unmet pairs (``unmet_contract``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Collection, Iterable
from typing import Any

from conformance.matrix.axes import pairwise_values, valid
from conformance.matrix.cells import DEFAULT_EXECUTORS, Cell
from conformance.matrix.features import FEATURES, features
from fixtures.compositions import COMPOSITIONS
from fixtures.executors import EXECUTORS
from fixtures.inits import INITS, InitMode

# An item of the contract: ((name, value), ...) in the order of ``ITEM_AXES``.
Item = tuple[tuple[str, Any], ...]
ITEM_AXES = ("feature", "family", "scenario", "init")

# The inits that treat a feature specially, so that a feature meets each of them: a meta
# init materializes buffers and the root's own tensors (through reset_parameters or a state
# dict), a broadcast must carry a buffer drawn at random on each rank, and a state dict names
# a tied weight twice.
SPECIAL_INITS: dict[str, Callable[[InitMode], bool]] = {
    "trained_buffer": lambda i: i.on_meta,
    "persistent_buffer": lambda i: i.on_meta,
    "random_buffer": lambda i: i.on_meta or i.broadcast,
    "root_owned": lambda i: i.on_meta,
    "tie": lambda i: i.state_dict is not None,
}
assert set(SPECIAL_INITS) <= set(FEATURES)


def family(composition: str) -> str:
    """The transform family of a composition: DDP's replicate, FSDP's shard."""
    return "ddp" if COMPOSITIONS[composition].replicated else "fsdp"


def items_of(row: dict[str, Any]) -> frozenset[Item]:
    """The contract's items a cell (or a row of an array being grown) meets: none under an
    optional executor (one with a probe: nvFuser, torch.compile's), whose own failures may end
    the cell before it runs what the item names; the items are met on the executors every
    Thunder has."""
    if EXECUTORS[row.get("executors", DEFAULT_EXECUTORS)].probe is not None:
        return frozenset()
    spec = row.get("spec")
    found = features(row["model"], row["tie"], row.get("world_size", 2), spec)
    fam = family(row["composition"])
    out = {(("feature", f), ("family", fam), ("scenario", row["scenario"])) for f in found}
    out |= {
        (("feature", f), ("init", row["init"]))
        for f in found
        if f in SPECIAL_INITS and SPECIAL_INITS[f](INITS[row["init"]])
    }
    return frozenset(out)


def contracted(values: dict[str, list[Any]]) -> frozenset[Item]:
    """Every item some allowed row over ``values`` (an array's values) meets."""
    return _contracted(tuple((a, tuple(v)) for a, v in values.items() if a in _ROW_AXES))


_ROW_AXES = ("model", "tie", "composition", "init", "scenario", "world_size")


@functools.cache
def _contracted(values: tuple[tuple[str, tuple[Any, ...]], ...]) -> frozenset[Item]:
    axes = dict(values)
    out: set[Item] = set()
    for combo in itertools.product(*(axes[a] for a in _ROW_AXES)):
        row = dict(zip(_ROW_AXES, combo, strict=True))
        if valid(row):
            out |= items_of(row)
    return frozenset(out)


def unmet_contract(
    ran: Iterable[Cell],
    world_size: int,
    unsupported: Collection[str] = (),
    profile: str = "ci",
    nightly: Iterable[Cell] | None = None,
) -> list[dict[str, Any]]:
    """The contract's items (over every axis's values at ``world_size``, those in
    ``unsupported`` left out) that none of the real cells that ran meets, as
    ``{name: value, ...}``, each with ``covered_by`` where known: ci, whose generator meets
    every one (a kit test holds it to that), for another profile; for ci, nightly where its
    cells (``nightly``, given) meet it, else full, whose product meets every allowed one."""
    wanted = contracted(pairwise_values("ci", world_size, unsupported))
    unmet = sorted(wanted - _met(ran), key=_order)
    if profile == "ci" and nightly is None:
        return [dict(item) for item in unmet]
    by_nightly = _met(nightly or ())
    return [
        {**dict(item), "covered_by": "ci" if profile != "ci" else "nightly" if item in by_nightly else "full"}
        for item in unmet
    ]


def _met(cells: Iterable[Cell]) -> set[Item]:
    """The items the real cells meet (a simulated one checks no numerics and no state dict)."""
    met: set[Item] = set()
    for cell in cells:
        # the contract is Thunder's transforms': PyTorch's parallelism's cells judge other areas
        if not cell.simulated and COMPOSITIONS[cell.composition].parallelism == "thunder":
            met |= items_of(cell.__dict__)
    return met


def _order(item: Item) -> tuple:
    return tuple((ITEM_AXES.index(a), FEATURES.index(v) if a == "feature" else str(v)) for a, v in item)

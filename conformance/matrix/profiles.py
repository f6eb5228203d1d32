"""Profiles: which cells a run covers. ``full`` is the whole product of the axes under the
constraints, ``nightly`` a strength-3 covering array of it, ``ci`` a pairwise one, ``smoke``
one cell per kind of check.

The covering array is built over the compositions that the Thunder under test offers (the
worlds probe them first): a pair of values that met only in a cell reported unsupported
would never run. Each unsupported composition, offload policy or executor keeps one cell, which
reports why. Cells at
the boundary world sizes (3 and 4: first dimensions that do not divide, the last rank named
by an option) join ci by hand, and nightly and full as a pairwise covering array of their own.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from conformance.matrix import simulated
from conformance.matrix.cells import AXES, DEFAULT_SCENARIO, Cell
from fixtures.compositions import COMPOSITIONS
from fixtures.executors import EXECUTORS
from fixtures.inits import INITS
from fixtures.models import MODELS, fixture_for
from fixtures.offloads import POLICIES
from fixtures.options import BUCKETINGS, DTYPES, SCENARIOS, SHARDINGS, TIES

PROFILES = ("smoke", "ci", "nightly", "full", "scale")
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
    # a model whose eager twin replays Thunder's dropout masks does so in training only
    if "model" in row and MODELS[row["model"]].output_dropout is not None and row.get("scenario", "train") != "train":
        return False
    # FSDP's sharding does not apply to DDP: its cells carry the default (bucketing names a
    # bucket size there: collectives.ddp_bucket_mb)
    replicated = "composition" in row and COMPOSITIONS[row["composition"]].replicated
    return not (replicated and row.get("sharding", "zero2") != "zero2")


# The axes whose values the worlds probe (the Thunder under test may lack what a value needs).
# ``unsupported`` maps a value of one of them to why: their names never collide (a kit test
# holds them apart), so one flat mapping names them all.
PROBED_AXES = ("composition", "offload", "executors")


def axis_values(world_size: int, unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """Every axis's values; probed values named in ``unsupported`` left out."""
    return {
        "model": list(MODELS),
        "init": list(INITS),
        "composition": [c for c in COMPOSITIONS if c not in unsupported],
        "tie": list(TIES),
        "offload": [p for p in POLICIES if p not in unsupported],
        "sharding": list(SHARDINGS),
        "bucketing": list(BUCKETINGS),
        "dtype": list(DTYPES),
        "executors": [e for e in EXECUTORS if e not in unsupported],
        "scenario": list(SCENARIOS),
        "world_size": [world_size],
    }


def pairwise_values(profile: str, world_size: int, unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """The values a profile's covering array is built over (and its coverage promise made
    for). ci's one array takes every axis's (``_grown``). Beyond ci, FSDP's compositions only
    (DDP's get arrays of their own, ``replicated_values``: FSDP's sharding and bucketing do
    not apply to them, and a constraint pinning those bloats covertable's array) and not the
    models that train only (``trains_only``: a constraint over the scenario axis made
    covertable's strength-3 array take minutes)."""
    values = axis_values(world_size, unsupported)
    if profile != "ci":
        values["composition"] = [c for c in values["composition"] if not COMPOSITIONS[c].replicated]
        values["model"] = [m for m in values["model"] if m not in TRAINS_ONLY]
    return values


# models whose eager twin replays Thunder's dropout masks (conformance/rank/dropout.py), which
# only training does: they run no scenario beyond it. A constraint over the scenario axis made
# covertable's strength-3 array take minutes, so they get arrays of their own instead
TRAINS_ONLY = tuple(m for m, fixture in MODELS.items() if fixture.output_dropout is not None)


def trains_only(values: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """An array's values (FSDP's or DDP's) for the models that train only: those models, the
    scenario ``train``; nothing where there are no such models."""
    if not TRAINS_ONLY:
        return {}
    # only the ties those models offer: a value no row may take would leave its pairs to chase
    ties = [t for t in values["tie"] if any(t in MODELS[m].ties for m in TRAINS_ONLY)]
    return {**values, "model": list(TRAINS_ONLY), "tie": ties, "scenario": ["train"]}


def replicated_values(world_size: int, unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """The values that apply to DDP's compositions (those the Thunder under test offers):
    every axis's but FSDP's sharding, which its cells carry at its default, and the inits DDP
    can express (the models that train only aside). Empty compositions where it offers none."""
    values = axis_values(world_size, unsupported)
    values["composition"] = [c for c in values["composition"] if COMPOSITIONS[c].replicated]
    values["model"] = [m for m in values["model"] if m not in TRAINS_ONLY]
    values["sharding"] = ["zero2"]
    values["init"] = [
        i
        for i in values["init"]
        if any(valid({"composition": c, "init": i}) for c in COMPOSITIONS if COMPOSITIONS[c].replicated)
    ]
    return values


# the model of a generated cell (conformance/test_generated.py): built from the cell's spec
GENERATED = "generated"


def cell_from_axes(axes: object) -> Cell:
    """The cell that ``axes`` (a replay's JSON, as ``Cell.axes()`` prints it) names, or a
    ValueError of one line saying what is wrong with it: an axis a Cell does not have, a value
    no registry offers, a combination that cannot exist."""
    if not isinstance(axes, dict):
        raise ValueError(f"expected a JSON object of a cell's axes, got {type(axes).__name__}")
    fields = {f.name: f for f in dataclasses.fields(Cell)}
    if unknown := [a for a in axes if a not in fields]:
        raise ValueError(f"unknown axis {', '.join(map(repr, unknown))} (a cell has {', '.join(fields)})")
    required = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
    if missing := [a for a in required if a not in axes]:
        raise ValueError(f"missing axis {', '.join(map(repr, missing))}")
    world_size = axes.get("world_size", 2)
    # bool is an int to Python, never a world size
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a whole number of ranks >= 1, got {world_size!r}")
    if not isinstance(axes.get("simulated", False), bool):
        raise ValueError(f"simulated must be true or false, got {axes['simulated']!r}")
    if axes.get("simulated"):
        cell = Cell(**axes)
        allowed = {**simulated.axis_values(), "world_size": [world_size]}
        for axis, values in allowed.items():
            if axis in axes and axes[axis] not in values:
                raise ValueError(f"{axis} {axes[axis]!r} is not one of {', '.join(map(str, values))}")
        if (why := simulated.why_not(cell)) or not simulated.valid(dataclasses.asdict(cell)):
            raise ValueError(f"cell {cell.id} cannot be simulated: {why or 'a tie the model does not offer'}")
        return cell
    allowed = axis_values(world_size)
    allowed["model"] = [*allowed["model"], GENERATED]
    for axis, values in allowed.items():
        if axis in axes and axes[axis] not in values:
            raise ValueError(f"{axis} {axes[axis]!r} is not one of {', '.join(map(str, values))}")
    spec = axes.get("spec")
    if (spec is not None) != (axes["model"] == GENERATED):
        raise ValueError(f"a spec (a generated model's structure) goes with model {GENERATED!r} and only with it")
    cell = Cell(**axes)
    if spec is not None:
        try:
            structure = json.loads(spec) if isinstance(spec, str) else None
        except ValueError:
            structure = None
        if not isinstance(structure, dict) or set(structure) != {"widths", "bias", "ties"}:
            raise ValueError("spec must be a JSON string of an object with widths, bias and ties")
        ties = fixture_for(cell.model, spec).ties
        if cell.tie not in ties:
            raise ValueError(f"tie {cell.tie!r} does not fit the spec's ties {structure['ties']!r}")
    # a generated model offers the tie its spec implies (checked above), not a registered one's
    row = {"composition": cell.composition, "init": cell.init} if spec is not None else dataclasses.asdict(cell)
    if not valid(row):
        raise ValueError(
            f"cell {cell.id} cannot exist (a tie the model does not offer, or an init its composition cannot express)"
        )
    return cell


def _full(values: dict[str, list[Any]]) -> Iterator[Cell]:
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


def _covering(values: dict[str, list[Any]], strength: int = 2) -> Iterator[Cell]:
    for row in _rows(values, strength):
        yield Cell(**row)


def _grown(values: dict[str, list[Any]]) -> Iterator[Cell]:
    """ci's array: pairwise over every axis but the composition and the scenario, then grown
    by each in turn (conformance/matrix/growth.py). A composition costs a cell nothing more,
    so DDP's take rows of the array (those at FSDP's default sharding: it does not apply to
    them) instead of an array of their own; a scenario beyond training compiles again, so each
    lands on the cells whose second compilation costs least for the pairs it meets.
    (covertable's array over every axis: 148 cells, ~470 s here.)"""
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


def _boundary_arrays(world_size: int, unsupported: Collection[str]) -> Iterator[Cell]:
    """A pairwise covering array at each boundary world size other than the session's: FSDP's
    compositions' and, where the Thunder under test offers DDP, DDP's."""
    for n in BOUNDARY_WORLD_SIZES:
        if n != world_size:
            yield from _covering(pairwise_values("full", n, unsupported))
            if (ddp := replicated_values(n, unsupported))["composition"]:
                yield from _covering(ddp)


def _smoke(world_size: int) -> Iterator[Cell]:
    """One cell per kind of check: plain, tied and meta and offloaded, negative, a probed
    composition."""
    yield Cell("mlp", "real", "fsdp_jit", world_size=world_size)
    yield Cell("tied_lm", "meta_module_init", "jit_fsdp", tie="tied", offload="all", world_size=world_size)
    yield Cell("no_reset", "meta_module_init", "fsdp_jit", world_size=world_size)
    yield Cell("mlp", "real", "legacy_jit_fsdp", world_size=world_size)


# ci's cells at the boundary world sizes: models with a first dimension the world size does
# not divide (tied_lm's 16 and root_owned's 5 at 3; 7 and 33 at 4), ZERO3, a broadcast from
# the first and from the last rank, and the state dict the kit shards itself (padded) at each
# size. Small models only: a world of 3 or 4 ranks on 2 cores is slow (a litgpt cell at 3
# cost 16 s, tie_group's ZERO3 at 4 14 s: nightly runs them)
BOUNDARY_CI = (
    Cell("tied_lm", "real_broadcast_last", "fsdp_jit", tie="tied", sharding="zero3", world_size=3),
    Cell("root_owned", "meta_transformed_sd", "jit_fsdp", sharding="zero3", world_size=3),
    Cell("mlp", "real_broadcast_first", "jit_fsdp", offload="all", world_size=3),
    Cell("mlp", "real_broadcast_first", "fsdp_jit", sharding="zero3", world_size=4),
    Cell("mlp", "meta_transformed_sd", "fsdp_jit", sharding="zero3", bucketing="layer", world_size=4),
    Cell("tied_lm", "real_broadcast_last", "jit_fsdp", tie="tied", dtype="bfloat16", world_size=4),
    # DDP at an odd size: its all-reduce averages over 3, and a broadcast from the last rank
    Cell("tied_lm", "real_broadcast_last", "jit_ddp", tie="tied", bucketing="layer", world_size=3),
)


def _stand_in(axis: str, value: str, world_size: int, unsupported: Collection[str]) -> Cell:
    """The one cell an unsupported value of a probed axis keeps: it reports why it does not run."""
    model = next(m for m in MODELS.values() if not m.lacks_reset)
    composition = value if axis == "composition" else next(c for c in COMPOSITIONS if c not in unsupported)
    init = next(i for i in INITS if valid({"composition": composition, "init": i}))
    cell = Cell(model.name, init, composition, tie=model.ties[-1], world_size=world_size)
    return dataclasses.replace(cell, **{axis: value})


def _runnable(cell: Cell, unsupported: Collection[str]) -> Cell | None:
    """A hand-picked cell with its unsupported values put back to their defaults (None where
    the axis has none: the cell cannot run at all)."""
    fields = {f.name: f for f in dataclasses.fields(Cell)}
    for axis in PROBED_AXES:
        if getattr(cell, axis) in unsupported:
            if fields[axis].default is dataclasses.MISSING:
                return None
            cell = dataclasses.replace(cell, **{axis: fields[axis].default})
    return cell


def cells(profile: str, world_size: int, unsupported: Mapping[str, str]) -> list[Cell]:
    """The profile's cells at the session's world size (and the boundary sizes).
    ``unsupported``: a value of a probed axis (a composition, an offload policy, an executor) -> why the
    Thunder under test does not offer it, as the worlds' probe found."""
    if profile == "smoke":
        return list(dict.fromkeys(_smoke(world_size)))
    if profile == "scale":
        return list(simulated.covering(unsupported))
    runs = pairwise_values(profile, world_size, unsupported)
    ddp = replicated_values(world_size, unsupported)
    if profile == "ci":
        picked = (_runnable(c, unsupported) for c in (*BOUNDARY_CI, *simulated.CI))
        selected = [*_grown(runs), *(c for c in picked if c is not None)]
    elif profile == "nightly":
        # every triple at the session's size; the boundary sizes get what full gives them
        # (a pairwise array each), which covers everything BOUNDARY_CI was picked for
        # DDP: a pairwise array over the axes that apply to it; the models that train only:
        # a pairwise array with FSDP's compositions and one with DDP's
        selected = [
            *_covering(runs, strength=3),
            *(_covering(ddp) if ddp["composition"] else ()),
            *(_covering(trains_only(runs)) if TRAINS_ONLY else ()),
            *(_covering(trains_only(ddp)) if TRAINS_ONLY and ddp["composition"] else ()),
            *_boundary_arrays(world_size, unsupported),
            *simulated.covering(unsupported),
        ]
    else:
        selected = [
            *_full(runs),
            *_full(ddp),
            *(_full(trains_only(runs)) if TRAINS_ONLY else ()),
            *(_full(trains_only(ddp)) if TRAINS_ONLY else ()),
            *_boundary_arrays(world_size, unsupported),
            *simulated.covering(unsupported),
        ]
    offered = axis_values(world_size)
    selected += [
        _stand_in(axis, value, world_size, unsupported)
        for axis in PROBED_AXES
        for value in offered[axis]
        if value in unsupported
    ]
    return list(dict.fromkeys(selected))


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
            if pairs not in met and valid(dict(pairs)):
                unmet.append(dict(pairs))
    return unmet

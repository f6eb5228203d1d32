"""The axes' values and which combinations of them can exist: every axis's values (the
probed ones the Thunder under test lacks left out), the values a profile's covering array is
built over, and the cell a replay's JSON names, validated.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Collection
from typing import Any

from conformance.matrix import resharded, simulated
from conformance.matrix.cells import DEFAULT_CHECKPOINTING, Cell
from conformance.matrix.cells import DEFAULT_EXECUTORS as EXECUTORS_DEFAULT
from fixtures.checkpointing import CHECKPOINTINGS, numbered_blocks
from fixtures.compositions import COMPOSITIONS, FSDP_WIDTH
from fixtures.executors import EXECUTORS
from fixtures.inits import INITS, fresh_part
from fixtures.models import MODELS, fixture_for
from fixtures.offloads import POLICIES
from fixtures.options import BUCKETINGS, DTYPES, INFERENCE, MIXED, SCENARIOS, SHARDINGS, TIES


def valid(row: dict[str, Any]) -> bool:
    """Combinations that cannot exist: a tie the model does not offer, an init mode the
    composition cannot express."""
    if "model" in row and "tie" in row and row["tie"] not in MODELS[row["model"]].ties:
        return False
    if "composition" in row and "init" in row:
        inits = COMPOSITIONS[row["composition"]].inits
        if inits is not None and row["init"] not in inits:
            return False
    # a partly-meta init needs a part a fine-tune adds that shares nothing with the loaded rest
    partly_meta = row.get("init") in INITS and INITS[row["init"]].partly_meta
    if partly_meta and "model" in row and not has_fresh_part(row["model"], row.get("tie", "untied")):
        return False
    # a model whose eager twin replays Thunder's dropout masks does so in training only
    if "model" in row and MODELS[row["model"]].output_dropout is not None and row.get("scenario", "train") != "train":
        return False
    # FSDP's sharding does not apply to DDP: its cells carry the default (bucketing names a
    # bucket size there: buckets.ddp_bucket_mb)
    replicated = "composition" in row and COMPOSITIONS[row["composition"]].replicated
    if replicated and row.get("sharding", "zero2") != "zero2":
        return False
    # checkpointing applies to models with blocks, offloading nothing
    if row.get("checkpointing", DEFAULT_CHECKPOINTING) != DEFAULT_CHECKPOINTING:
        if "model" in row and not has_blocks(row["model"]):
            return False
        if row.get("offload", "none") != "none":
            return False
    if not _tensor_parallel_valid(row) or not _hybrid_valid(row):
        return False
    # mixed precision is FSDP2's policy
    return not (row.get("dtype") in MIXED and "composition" in row and not _fsdp2(row["composition"]))


@functools.cache
def has_fresh_part(model: str, tie: str) -> bool:
    """Whether the model, so tied, has a part a fine-tune adds (``fixtures.inits.fresh_part``),
    built on the meta device: nothing is drawn."""
    import torch

    fixture = MODELS[model]
    with torch.device("meta"):
        module = fixture.build(tie == "tied")
    return bool(fresh_part(module, fixture.fresh))


@functools.cache
def has_blocks(model: str) -> bool:
    """Whether the model has numbered blocks to checkpoint, built on the meta device."""
    import torch

    with torch.device("meta"):
        return bool(numbered_blocks(MODELS[model].build(False)))


# hybrid sharding's world: two rows of FSDP_WIDTH ranks (a CPU world of 4 gloo ranks holds it)
HYBRID_WORLD_SIZE = 2 * FSDP_WIDTH

# tensor parallelism's scenarios: inference alone, and training
TENSOR_PARALLEL_SCENARIOS = (INFERENCE, "train")
# the values tensor parallelism's cells hold at their defaults: FSDP's sharding and bucketing,
# offloading and checkpointing do not apply to it; Thunder's default executors; float32 (below
# it numerics' tolerance comes from a float32 twin that training in lockstep keeps, not yet
# built for this family)
_TENSOR_PARALLEL_DEFAULTS = {
    "offload": "none",
    "sharding": "zero2",
    "bucketing": "none",
    "dtype": "float32",
    "executors": EXECUTORS_DEFAULT,
    "checkpointing": DEFAULT_CHECKPOINTING,
}


def _tensor_parallel_valid(row: dict[str, Any]) -> bool:
    """Tensor parallelism applies to the models whose fixture gives a plan, with its own
    scenarios and every other axis at its default; its ``inference`` scenario to it alone."""
    if not ("composition" in row and COMPOSITIONS[row["composition"]].parallelism == "tensor"):
        return row.get("scenario") != INFERENCE
    if "model" in row and not (row["model"] in MODELS and MODELS[row["model"]].tp_plan):
        return False
    if row.get("scenario", "train") not in TENSOR_PARALLEL_SCENARIOS:
        return False
    return all(row.get(axis, value) == value for axis, value in _TENSOR_PARALLEL_DEFAULTS.items())


def _hybrid_valid(row: dict[str, Any]) -> bool:
    """Hybrid sharding needs more than one row of FSDP_WIDTH ranks; it trains, offloading and
    checkpointing nothing (its judgment so far: numerics, conformance/checks/area.py)."""
    if not ("composition" in row and COMPOSITIONS[row["composition"]].hybrid):
        return True
    n = row.get("world_size")
    if n is not None and (n % FSDP_WIDTH or n <= FSDP_WIDTH):
        return False
    at_defaults = {"scenario": "train", "offload": "none", "checkpointing": DEFAULT_CHECKPOINTING}
    return all(row.get(axis, value) == value for axis, value in at_defaults.items())


def hybrid_values(unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """The values of hybrid sharding's cells: its compositions (none offered: an empty list) at
    HYBRID_WORLD_SIZE, Thunder's own transforms' values but its defaults where it has them."""
    values = _uncheckpointed(axis_values(HYBRID_WORLD_SIZE, unsupported))
    values["composition"] = [c for c in COMPOSITIONS if c not in unsupported and COMPOSITIONS[c].hybrid]
    values["model"] = [m for m in values["model"] if m not in TRAINS_ONLY]
    expressed = {i for c in values["composition"] for i in values["init"] if valid({"composition": c, "init": i})}
    values["init"] = [i for i in values["init"] if i in expressed]
    values.update(offload=["none"], scenario=["train"])
    return values


def tensor_parallel_values(world_size: int, unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """The values of tensor parallelism's cells at ``world_size``: its compositions (those
    offered; none: an empty list), the models with a plan and the ties they offer, the real
    init, its scenarios; every other axis at its default."""
    models = [m for m, fixture in MODELS.items() if fixture.tp_plan]
    return {
        "model": models,
        "init": ["real"],
        "composition": [
            c for c in COMPOSITIONS if c not in unsupported and COMPOSITIONS[c].parallelism == "tensor"
        ],
        "tie": [t for t in TIES if any(t in MODELS[m].ties for m in models)],
        **{axis: [value] for axis, value in _TENSOR_PARALLEL_DEFAULTS.items()},
        "scenario": list(TENSOR_PARALLEL_SCENARIOS),
        "world_size": [world_size],
    }


def _fsdp2(composition: str) -> bool:
    c = COMPOSITIONS[composition]
    return c.parallelism == "torch" and not c.replicated


# The axes whose values the worlds probe (the Thunder under test may lack what a value needs).
# ``unsupported`` maps a value of one of them to why: their names never collide (a kit test
# holds them apart), so one flat mapping names them all.
PROBED_AXES = ("composition", "offload", "executors")


def axis_values(world_size: int, unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """Every axis's values; probed values named in ``unsupported`` left out."""
    return {
        "model": list(MODELS),
        "init": list(INITS),
        # Thunder's own transforms: PyTorch's parallelism has arrays of its own (torch_parallel_values)
        # (hybrid sharding's at one world size: arrays of their own, hybrid_values)
        "composition": [
            c
            for c in COMPOSITIONS
            if c not in unsupported and COMPOSITIONS[c].parallelism == "thunder" and not COMPOSITIONS[c].hybrid
        ],
        "tie": list(TIES),
        "offload": [p for p in POLICIES if p not in unsupported],
        "sharding": list(SHARDINGS),
        "bucketing": list(BUCKETINGS),
        "dtype": [d for d in DTYPES if d not in MIXED],  # FSDP2's policy: torch_parallel_values
        "executors": [e for e in EXECUTORS if e not in unsupported],
        "checkpointing": list(CHECKPOINTINGS),
        "scenario": list(SCENARIOS),
        "world_size": [world_size],
    }


def _uncheckpointed(values: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """``values`` without the checkpointing axis: an array over them leaves it at its default.
    Checkpointing applies to the models with blocks only, so paired with every other value it
    would bring a litgpt cell each; its cells have an array of their own (``checkpointing_values``)."""
    return {a: v for a, v in values.items() if a != "checkpointing"}


def pairwise_values(profile: str, world_size: int, unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """The values a profile's covering array is built over (and its coverage promise made
    for). ci's one array takes every axis's (``arrays.grown``). Beyond ci, FSDP's compositions only
    (DDP's get arrays of their own, ``replicated_values``: FSDP's sharding and bucketing do
    not apply to them, and a constraint pinning those bloats covertable's array) and not the
    models that train only (``trains_only``: a constraint over the scenario axis made
    covertable's strength-3 array take minutes)."""
    values = _uncheckpointed(axis_values(world_size, unsupported))
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
    values = _uncheckpointed(axis_values(world_size, unsupported))
    values["composition"] = [c for c in values["composition"] if COMPOSITIONS[c].replicated]
    values["model"] = [m for m in values["model"] if m not in TRAINS_ONLY]
    values["sharding"] = ["zero2"]
    values["init"] = [
        i
        for i in values["init"]
        if any(valid({"composition": c, "init": i}) for c in COMPOSITIONS if COMPOSITIONS[c].replicated)
    ]
    return values


# the scenarios of PyTorch's parallelism so far: training, and after it a no_grad forward,
# gradient accumulation with the sync skipped as the parallelism offers, a step at a second
# input shape
TORCH_PARALLEL_SCENARIOS = ("train", "infer", "accumulate", "reshape", "resume")

# PyTorch's parallelism's models in ci and nightly: one without blocks (FSDP2 shards the root
# alone; tied or not), one with (the benchmark's per-block units: litgpt's transformer blocks)
TORCH_PARALLEL_MODELS = ("tied_lm", "litgpt_llama")


def torch_parallel_values(world_size: int, unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """The values that apply to the compositions of PyTorch's parallelism (those offered):
    the inits they can express, no offloading, FSDP2's reshard_after_forward as the sharding axis (DDP's cells
    at its default), both dtypes and ties, and FSDP2's mixed precision, the scenarios they run; Thunder's
    default executors. Empty compositions where none is offered."""
    values = _uncheckpointed(axis_values(world_size, unsupported))
    values["composition"] = [
        c for c in COMPOSITIONS if c not in unsupported and COMPOSITIONS[c].parallelism == "torch"
    ]
    values["model"] = list(TORCH_PARALLEL_MODELS)
    inits = {i for c in values["composition"] for i in (COMPOSITIONS[c].inits or INITS)}
    values["init"] = [i for i in INITS if i in inits]
    # the scenarios whose records every composition can produce (resume's calls are Thunder's
    # own checkpoint functions)
    scenarios = [s for s in SCENARIOS if s in TORCH_PARALLEL_SCENARIOS]
    values.update(offload=["none"], bucketing=["none"], scenario=scenarios)
    if any(_fsdp2(c) for c in values["composition"]):
        values["dtype"] = [*values["dtype"], *MIXED]
    values["executors"] = [EXECUTORS_DEFAULT]
    return values


def checkpointing_values(world_size: int, unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """The values of the checkpointed cells: every block checkpointed, on the models with
    blocks, under Thunder's own transforms (FSDP's and DDP's: ``axis_values``' compositions),
    offloading nothing (``valid``); every other axis as the session's array has it."""
    values = axis_values(world_size, unsupported)
    values["model"] = [m for m in values["model"] if has_blocks(m)]
    values.update(checkpointing=[c for c in CHECKPOINTINGS if c != DEFAULT_CHECKPOINTING], offload=["none"])
    return values


def by_replication(values: dict[str, list[Any]]) -> list[dict[str, list[Any]]]:
    """PyTorch's parallelism's values (``torch_parallel_values``) as one set for its sharded
    compositions and one for its replicated ones, each with only the inits and the sharding its
    compositions can take: no constraint left for covertable to reject rows by, which bloated
    the strength-3 array to 442 cells (52 s) where these two make far fewer."""
    out = []
    for replicated in (False, True):
        compositions = [c for c in values["composition"] if COMPOSITIONS[c].replicated == replicated]
        if not compositions:
            continue
        part = {**values, "composition": compositions}
        part["init"] = [i for i in values["init"] if all(valid({"composition": c, "init": i}) for c in compositions)]
        part["sharding"] = [s for s in values["sharding"] if valid({"composition": compositions[0], "sharding": s})]
        part["dtype"] = [d for d in values["dtype"] if valid({"composition": compositions[0], "dtype": d})]
        out.append(part)
    return out


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
    saved_at = axes.get("saved_at")
    if saved_at is not None and (not isinstance(saved_at, int) or isinstance(saved_at, bool)):
        raise ValueError(f"saved_at must be a whole number of ranks, got {saved_at!r}")
    if (why := resharded.why_not(cell := Cell(**axes))) is not None:
        raise ValueError(f"cell {cell.id} cannot resume resharded: {why}")
    allowed = axis_values(world_size)
    allowed["model"] = [*allowed["model"], GENERATED]
    allowed["composition"] = list(COMPOSITIONS)  # PyTorch's parallelism's too
    allowed["scenario"] = [*allowed["scenario"], INFERENCE]  # tensor parallelism's
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

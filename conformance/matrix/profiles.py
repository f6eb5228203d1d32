"""Profiles: which cells a run covers. ``full`` is the whole product of the axes under the
constraints, ``nightly`` a strength-3 covering array of it, ``ci`` a pairwise one, ``smoke``
one cell per kind of check.

The covering array is built over the compositions that the Thunder under test offers (the
worlds probe them first): a pair of values that met only in a cell reported unsupported
would never run. Each unsupported composition, offload policy or executor keeps one cell, which
reports why. Cells at
the boundary world sizes (3 and 4: first dimensions that do not divide, the last rank named
by an option) join ci by hand, and nightly and full as a pairwise covering array of their own.

The values an array ranges over are ``axes``'s, the arrays themselves ``arrays``'s, and what
a run's cells covered ``coverage``'s.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Iterator, Mapping

from conformance.matrix import resharded, simulated
from conformance.matrix.arrays import Refused, covering, full, grown
from conformance.matrix.axes import (
    PROBED_AXES,
    TRAINS_ONLY,
    axis_values,
    by_replication,
    checkpointing_values,
    hybrid_values,
    pairwise_values,
    replicated_values,
    tensor_parallel_values,
    torch_parallel_values,
    trains_only,
    valid,
)
from conformance.matrix.cells import Cell
from fixtures.compositions import COMPOSITIONS, pairing
from fixtures.executors import EXECUTORS
from fixtures.inits import INITS
from fixtures.models import MODELS
from fixtures.torch_parallel import ROOT_WRAP

PROFILES = ("smoke", "ci", "nightly", "full", "scale")
# world sizes beside the session's own: every model (the negative one aside) has a first
# dimension that neither divides (litgpt's vocab 37, tied_lm's 16 and 33, tie_group's 9 and 5, mlp's 7)
BOUNDARY_WORLD_SIZES = (3, 4)


def _boundary_arrays(world_size: int, unsupported: Collection[str]) -> Iterator[Cell]:
    """A pairwise covering array at each boundary world size other than the session's: FSDP's
    compositions' and, where the Thunder under test offers DDP, DDP's."""
    refused = _refused(unsupported)
    for n in BOUNDARY_WORLD_SIZES:
        if n != world_size:
            yield from covering(pairwise_values("full", n, unsupported), refused=refused)
            if (ddp := replicated_values(n, unsupported))["composition"]:
                yield from covering(ddp, refused=refused)


def _refused(unsupported: Collection[str]) -> Refused:
    """The (composition, executors) pairs the probe refused (``pairing``): no array holds them."""
    return frozenset((c, e) for c in COMPOSITIONS for e in EXECUTORS if pairing(c, e) in unsupported)


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
# size. Small models only: a world of 3 or 4 ranks on 2 cores is slow, so the larger models
# (litgpt, tie_group's ZERO3) run at those sizes in nightly
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


# FSDP2 at the root alone (a composition whose ``fsdp2_wrap`` is ROOT_WRAP) makes other units than the
# blocks' wrap only on a model with blocks, and only its units differ: ci carries it there, once
# at each resharding, in float32 and under FSDP2's mixed precision (which casts every unit's
# inputs), not in the family's array, where 6 of its 8 cells were tied_lm's, whose units are the
# blocks' wrap's own (docs/measurements.md, session 41). Nightly and full carry it in the
# family's arrays.
def _root_wrap_ci(world_size: int, unsupported: Collection[str]) -> Iterator[Cell]:
    for name, composition in COMPOSITIONS.items():
        if composition.fsdp2_wrap == ROOT_WRAP and name not in unsupported:
            yield Cell("litgpt_llama", "real", name, sharding="zero3", world_size=world_size)
            yield Cell("litgpt_llama", "real", name, sharding="zero2", dtype="mixed_bfloat16", world_size=world_size)


# Checkpointing in ci: every block of a litgpt model checkpointed under FSDP's ZERO2 (its
# gathered parameters saved beside the blocks' inputs), FSDP's ZERO3 in bfloat16 on the meta
# device, DDP with the weights tied, and ThunderFX over FSDP2 (dynamo hands Thunder the
# checkpointed regions). Nightly and full carry an array of its own over Thunder's transforms
# (``checkpointing_values``).
CHECKPOINTING_CI = (
    Cell("litgpt_llama", "real", "fsdp_jit", checkpointing="blocks"),
    Cell("litgpt_neox", "meta_module_init", "jit_fsdp", sharding="zero3", dtype="bfloat16", checkpointing="blocks"),
    Cell("litgpt_llama", "real_broadcast_first", "jit_ddp", tie="tied", checkpointing="blocks"),
    Cell("litgpt_llama", "real", "thunderfx_fsdp2", checkpointing="blocks"),
)


def _checkpointing_ci(world_size: int, unsupported: Collection[str]) -> Iterator[Cell]:
    for cell in CHECKPOINTING_CI:
        if (runnable := _runnable(dataclasses.replace(cell, world_size=world_size), unsupported)) is not None:
            yield runnable


# Tensor parallelism in ci: inference on the small MLP at 2 ranks and unevenly at 3 (20 hidden
# rows), on both litgpt MLPs (LLaMA's two gates over one input); training at 2 and 3. Nightly
# and full carry every cell of the family at the session's size and the boundary ones.
TENSOR_PARALLEL_CI = (
    Cell("mlp", "real", "thunderfx_tp", scenario="inference", world_size=2),
    Cell("mlp", "real", "thunderfx_tp", scenario="inference", world_size=3),
    Cell("litgpt_llama", "real", "thunderfx_tp", scenario="inference", world_size=2),
    Cell("litgpt_neox", "real", "thunderfx_tp", tie="tied", scenario="inference", world_size=3),
    Cell("mlp", "real", "thunderfx_tp", world_size=2),
    Cell("litgpt_llama", "real", "thunderfx_tp", world_size=3),
)


def _tensor_parallel(profile: str, world_size: int, unsupported: Collection[str]) -> Iterator[Cell]:
    """Tensor parallelism's cells: ci's hand-picked ones, every cell of the family elsewhere
    (at the session's world size and the boundary ones); none where no composition of it is
    offered."""
    if not tensor_parallel_values(world_size, unsupported)["composition"]:
        return
    if profile == "ci":
        yield from (c for c in TENSOR_PARALLEL_CI if c.composition not in unsupported)
        return
    for n in dict.fromkeys((world_size, *BOUNDARY_WORLD_SIZES)):
        yield from full(tensor_parallel_values(n, unsupported))


# Hybrid sharding in ci, at 4 ranks (a 2 x 2 mesh): the plugin's default broadcast (rank 0), and
# a broadcast from the last rank under ZERO3 on a tied model (the broadcast rank mapped into a
# row and a column that are not rank 0's). Nightly: a pairwise array of its values; full: all.
HYBRID_CI = (
    Cell("mlp", "real", "jit_hybrid", world_size=4),
    Cell("tied_lm", "real_broadcast_last", "jit_hybrid", tie="tied", sharding="zero3", world_size=4),
)


def _hybrid(profile: str, unsupported: Collection[str]) -> Iterator[Cell]:
    values = hybrid_values(unsupported)
    if not values["composition"]:
        return
    if profile == "ci":
        yield from (c for c in HYBRID_CI if c.composition in values["composition"])
    elif profile == "nightly":
        yield from covering(values)
    else:
        yield from full(values)


def _resharded(profile: str, unsupported: Collection[str]) -> Iterator[Cell]:
    """The profile's resharded resumes (conformance/matrix/resharded.py) that can exist."""
    return (c for c in resharded.cells(profile, unsupported) if valid(dataclasses.asdict(c)))


def _stand_in(
    axis: str, value: str, world_size: int, unsupported: Collection[str], composition: str | None = None
) -> Cell:
    """The one cell an unsupported value of a probed axis keeps (with ``composition``: the
    pair it makes with that composition): it reports why it does not run."""
    model = next(m for m in MODELS.values() if not m.lacks_reset)
    if composition is None:
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


def carries_plain_jit(profile: str, cell: Cell) -> bool:
    """Whether a rank compiles plain ``thunder.jit`` of the cell's model, the reference for what
    the forward saves (``rank/plain_jit.py``). ci carries it where it is cheapest, on the cells
    that do not offload: on the offloading ones too, it cost ci 157 s of its 655 (1.24x, 33
    compiles against 14); every other profile carries it on every cell."""
    return profile != "ci" or cell.offload == "none"


def cells(profile: str, world_size: int, unsupported: Mapping[str, str], contract: bool = True) -> list[Cell]:
    """The profile's cells at the session's world size (and the boundary sizes).
    ``unsupported``: a value of a probed axis (a composition, an offload policy, an executor) -> why the
    Thunder under test does not offer it, as the worlds' probe found. ``contract``: ci's array
    meets the coverage contract (conformance/matrix/contract.py); without it, ci's array is
    the pairwise one alone (the kit's tests show what the contract adds)."""
    # only which values are unsupported shapes the cells, never why
    return list(_cells(profile, world_size, frozenset(unsupported), contract))


# Growing a covering array takes seconds (nightly's strength-3 one about half a minute here),
# and a run asks for the same profile again at its end (the contract's report): made once.
@functools.cache
def _cells(profile: str, world_size: int, unsupported: frozenset[str], contract: bool) -> tuple[Cell, ...]:
    return tuple(_generate(profile, world_size, unsupported, contract))


def _generate(profile: str, world_size: int, unsupported: Collection[str], contract: bool) -> list[Cell]:
    if profile == "smoke":
        return list(dict.fromkeys(_smoke(world_size)))
    if profile == "scale":
        return list(simulated.covering(unsupported))
    runs = pairwise_values(profile, world_size, unsupported)
    ddp = replicated_values(world_size, unsupported)
    # PyTorch's parallelism under Thunder: an array of its own in every profile but smoke
    torch_parallel = torch_parallel_values(world_size, unsupported)
    torch_cells = list(grown(torch_parallel, contract=False)) if torch_parallel["composition"] else []
    refused = _refused(unsupported)
    if profile == "ci":
        picked = (_runnable(c, unsupported) for c in (*BOUNDARY_CI, *simulated.CI))
        blocks_wrap = [c for c in torch_parallel["composition"] if COMPOSITIONS[c].fsdp2_wrap != ROOT_WRAP]
        torch_cells = list(grown({**torch_parallel, "composition": blocks_wrap}, contract=False)) if blocks_wrap else []
        torch_cells += _root_wrap_ci(world_size, unsupported)
        selected = [
            *grown(runs, contract, refused),
            *(c for c in picked if c is not None),
            *torch_cells,
            *_checkpointing_ci(world_size, unsupported),
            *_tensor_parallel(profile, world_size, unsupported),
            *_hybrid(profile, unsupported),
            *_resharded(profile, unsupported),
        ]
    elif profile == "nightly":
        # every triple at the session's size; the boundary sizes get what full gives them
        # (a pairwise array each), which covers everything BOUNDARY_CI was picked for
        # DDP: a pairwise array over the axes that apply to it; the models that train only:
        # a pairwise array with FSDP's compositions and one with DDP's
        selected = [
            *covering(runs, strength=3, refused=refused),
            # (grown to ci's contract: its pairwise array alone met DDP's triples only by chance)
            *(grown(ddp, contract, refused) if ddp["composition"] else ()),
            *(covering(trains_only(runs), refused=refused) if TRAINS_ONLY else ()),
            *(covering(trains_only(ddp), refused=refused) if TRAINS_ONLY and ddp["composition"] else ()),
            # PyTorch's parallelism: every triple of its values, as Thunder's own transforms
            *(c for values in by_replication(torch_parallel) for c in covering(values, strength=3)),
            *grown(checkpointing_values(world_size, unsupported), contract=False, refused=refused),
            *_tensor_parallel(profile, world_size, unsupported),
            *_hybrid(profile, unsupported),
            *_resharded(profile, unsupported),
            *_boundary_arrays(world_size, unsupported),
            *simulated.covering(unsupported),
        ]
    else:
        selected = [
            *full(runs, refused),
            *full(ddp, refused),
            *(full(trains_only(runs), refused) if TRAINS_ONLY else ()),
            *(full(trains_only(ddp), refused) if TRAINS_ONLY else ()),
            *(full(torch_parallel) if torch_parallel["composition"] else ()),
            *full(checkpointing_values(world_size, unsupported), refused),
            *_tensor_parallel(profile, world_size, unsupported),
            *_hybrid(profile, unsupported),
            *_resharded(profile, unsupported),
            *_boundary_arrays(world_size, unsupported),
            *simulated.covering(unsupported),
        ]
    offered = axis_values(world_size)
    offered["composition"] = list(COMPOSITIONS)  # PyTorch's parallelism's stand in too
    selected += [
        _stand_in(axis, value, world_size, unsupported)
        for axis in PROBED_AXES
        for value in offered[axis]
        if value in unsupported
    ]
    selected += [
        _stand_in("executors", e, world_size, unsupported, composition=c)
        for c in offered["composition"]
        for e in offered["executors"]
        if pairing(c, e) in unsupported and c not in unsupported and e not in unsupported
    ]
    return list(dict.fromkeys(selected))


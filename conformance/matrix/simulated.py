"""Simulated cells: worlds of 7 to 1024 ranks acted out under torch's fake process group by
a few sampled ranks (conformance/rank/simulate.py), on models at real widths.

Only shards are ever real there, so the init modes are those that never hold a whole
parameter outside module-by-module materialization: each module's ``reset_parameters``, or
a transformed (already sharded) state dict. Weights are in the row pattern
(fixtures/patterns.py), exact in float32 only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from conformance.matrix.cells import DEFAULT_EXECUTORS, DEFAULT_SCENARIO, Cell
from fixtures.compositions import COMPOSITIONS
from fixtures.models import WIDE_MODELS

SAMPLED = 5  # processes of a simulated world, one per sampled rank
# odd sizes (7, 1000) leave partial and empty shards on the last ranks of every model here;
# 1024 is the size of a large job, where 3072 MLP rows make three-row shards
WORLD_SIZES = (7, 8, 64, 1000, 1024)
INITS = ("meta_module_init", "meta_transformed_sd")


def world_of(cell: Cell) -> tuple[int, bool]:
    """The world that serves ``cell``, as (processes, simulated): a real world of its size,
    or the one world of ``SAMPLED`` processes that every simulated cell shares."""
    return (SAMPLED, True) if cell.simulated else (cell.world_size, False)


def sampled_ranks(world_size: int) -> tuple[int, ...]:
    """The ``SAMPLED`` ranks that stand for a world of ``world_size``, ascending.

    A bug that hands rank r the shard of slot p(r) shows only on a sampled rank that p moves,
    so they are chosen for a family of plausible slot permutations (tests/support/
    permutations.py; docs/matrix.md tabulates which rank each moves):
      0, N - 1   the ends, with the partial and empty shards; moved by a reversal, any rotation
      2, 10      small ranks that string orders move (decimal: "10" < "2"; binary: 10, "1010",
                 sorts before 3, "11"), as do an even/odd interleave, a bit reversal and a
                 2-D mesh's transposition
      a prime    the smallest at least N // 3 (and past 10): odd and coprime with N, so moved by
                 every stride r -> a*r mod N, some of which keep 0 and every even rank
    Every permutation of the family that is not the identity moves one of them at every N up
    to 2048, two at the simulated sizes from 64 on (tests/unit/test_scale.py). Small worlds,
    where some coincide or do not exist, fill up with 1, 3, 4, ..."""
    wanted = [0, world_size - 1, 2, 10, _prime_at_least(max(world_size // 3, 11))]
    wanted += range(1, world_size)
    picked: list[int] = []
    for r in wanted:
        if 0 <= r < world_size and r not in picked:
            picked.append(r)
        if len(picked) == SAMPLED:
            break
    return tuple(sorted(picked))


def _prime_at_least(n: int) -> int:
    while any(n % d == 0 for d in range(2, int(n**0.5) + 1)):
        n += 1
    return n


def why_not(cell: Cell) -> str | None:
    """Why ``cell`` cannot be simulated, or None."""
    if cell.world_size < SAMPLED:
        return f"a simulated world has at least {SAMPLED} ranks (its sampled ranks), got {cell.world_size}"
    if cell.model not in WIDE_MODELS:
        return f"a simulated world runs the models at real widths ({', '.join(WIDE_MODELS)}), not {cell.model!r}"
    if cell.init not in INITS:
        return f"a simulated world holds only shards: init must be one of {', '.join(INITS)}, not {cell.init!r}"
    if cell.offload != "none" or cell.dtype != "float32":
        return "a simulated world runs without offloading, in float32 (its weights' row pattern is exact there)"
    if cell.scenario != DEFAULT_SCENARIO:
        return f"a simulated world runs one step to read its traces and shards, not the {cell.scenario!r} scenario"
    if cell.executors != DEFAULT_EXECUTORS:
        # what it checks (shards, the collectives traced) is the FSDP transform's, whichever
        # executor then runs the trace; not an axis there, so the scale array has none
        return f"a simulated world runs Thunder's default executors, not {cell.executors!r}"
    return None


def axis_values(unsupported: Collection[str] = ()) -> dict[str, list[Any]]:
    """Every axis's values for simulated cells."""
    return {
        "model": list(WIDE_MODELS),
        "init": list(INITS),
        # every init expressible, and Thunder's default executors offered wherever the composition
        # is (the plugins API's default recipe needs nvFuser: not on the CPU a simulated world runs on)
        "composition": [
            c
            for c in COMPOSITIONS
            if c not in unsupported and COMPOSITIONS[c].inits is None and COMPOSITIONS[c].executors_probe is None
        ],
        "tie": ["tied", "untied"],
        "offload": ["none"],
        "sharding": ["zero2", "zero3"],
        "bucketing": ["none", "layer", "block"],
        "dtype": ["float32"],
        "world_size": list(WORLD_SIZES),
    }


def valid(row: dict[str, Any]) -> bool:
    return "model" not in row or "tie" not in row or row["tie"] in WIDE_MODELS[row["model"]].ties


def covering(unsupported: Collection[str] = ()) -> Iterator[Cell]:
    """A pairwise covering array of the simulated axes (the ``scale`` profile)."""
    from covertable import make

    constraint = {"operator": "fn", "requires": ["model", "tie"], "evaluate": valid}
    for row in make(axis_values(unsupported), strength=2, constraints=[constraint]):
        yield Cell(**row, simulated=True)


# ci's simulated cells, at an odd size (partial and empty shards on the last ranks): a model at
# real width initialized both ways a simulated world can be. Module init is the one where
# Thunder cuts the shards itself (each submodule's fresh weights through FSDP's state-dict
# path); from a transformed state dict Thunder loads the shards the kit cut. Two only: a
# simulated cell costs 15-30 s on 2 cores; the scale profile runs them all
CI = (
    Cell(
        "pythia_160m",
        "meta_transformed_sd",
        "jit_fsdp",
        tie="tied",
        sharding="zero3",
        bucketing="block",
        world_size=1000,
        simulated=True,
    ),
    Cell("pythia_160m", "meta_module_init", "fsdp_jit", tie="untied", world_size=1000, simulated=True),
)

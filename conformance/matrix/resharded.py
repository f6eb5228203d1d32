"""Resharded resumes: cells whose ``resume`` checkpoint is taken at one world size and resumed
at another (a job restarted on more or fewer machines), which cells there are, and which
profile runs which.

Such a cell runs in two worlds: one of ``saved_at`` ranks trains it and takes the checkpoint
(``conformance/rank/scenarios/resharded.py``: ``save``), then the cell's own world of
``world_size`` ranks runs it as any ``resume`` cell, resuming from that checkpoint. Thunder's
own FSDP takes it through ``thunder.distributed.checkpoint`` (a full checkpoint, every
parameter whole: the one a restart at another size can load; Thunder's sharded one holds
plain per-rank shards, which no other world size can read)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator

from conformance.matrix.cells import DEFAULT_EXECUTORS, Cell
from conformance.matrix.simulated import world_of

# (saved at, resumed at): to more ranks, to fewer, and to half (rows of the model's uneven
# shards at 3 move to other ranks at 2 and 4)
PAIRS = ((2, 3), (3, 2), (4, 2))
# Thunder's FSDP, both orders and through the plugin: the compositions whose checkpoint is
# Thunder's own; ThunderFX over FSDP2, whose checkpoint is DCP's sharded one (DDP's is whole on
# every rank at any size: nothing to reshard)
COMPOSITIONS = ("jit_fsdp", "fsdp_jit", "plugins_fsdp", "thunderfx_fsdp2")
MODELS = ("mlp", "tied_lm", "litgpt_llama")  # uneven rows at 3 ranks; a tie; a litgpt GPT

# ci: both orders of Thunder's FSDP, to more ranks and to fewer (mlp's 20 hidden rows are 7/7/6
# at 3 ranks, 10/10 at 2), and DCP's resharding of ThunderFX over FSDP2 on a tied model
CI = (
    Cell("mlp", "real", "jit_fsdp", scenario="resume", world_size=3, saved_at=2),
    Cell("mlp", "real", "jit_fsdp", scenario="resume", world_size=2, saved_at=3),
    Cell("mlp", "real", "fsdp_jit", scenario="resume", world_size=3, saved_at=2),
    Cell("tied_lm", "real", "fsdp_jit", tie="tied", scenario="resume", world_size=2, saved_at=3),
    Cell("tied_lm", "real", "thunderfx_fsdp2", tie="tied", scenario="resume", world_size=3, saved_at=2),
)


def worlds_of(cell: Cell) -> list[tuple[int, bool]]:
    """Every world ``cell``'s task runs on, in order: a resharded resume's saving world first,
    then the cell's own (``simulated.world_of``)."""
    saving = [] if cell.saved_at is None else [(cell.saved_at, False)]
    return [*saving, world_of(cell)]


def block_world(cell: Cell, main: tuple[int, bool] | None) -> tuple[int, bool]:
    """The world whose block a run's order puts ``cell`` in: its own, or for a resharded resume
    the one of its two worlds that is not the run's ``main`` one (3→2 runs among the cells of
    3 ranks, while the main world waits idle), so that neither world starts twice for it."""
    return next((w for w in reversed(worlds_of(cell)) if w != main), world_of(cell))


def why_not(cell: Cell) -> str | None:
    """Why ``cell`` cannot be a resharded resume (None: it can)."""
    if cell.saved_at is None:
        return None
    if cell.scenario != "resume":
        return f"a checkpoint saved at another world size is the resume scenario's, not {cell.scenario!r}'s"
    if cell.simulated:
        return "a simulated world takes no checkpoint"
    if cell.composition not in COMPOSITIONS:
        return f"composition {cell.composition!r} takes no checkpoint to reshard (one of {', '.join(COMPOSITIONS)})"
    if cell.init != "real":
        return "the saving world and the resuming one build the model alike: init 'real' only"
    if cell.dtype != "float32" or cell.offload != "none" or cell.executors != "default":
        return "float32, no offloading and the default executors only (the other axes have same-size resumes)"
    if cell.saved_at == cell.world_size or cell.saved_at < 1:
        return f"saved_at must be another world size of at least 1 rank, got {cell.saved_at}"
    return None


def cells(profile: str, unsupported: Collection[str]) -> Iterator[Cell]:
    """The profile's resharded resumes: ci's hand-picked ones; every pair, model and
    composition elsewhere (each model with its last tie; the profile drops those ``axes.valid``
    refuses)."""
    from fixtures.compositions import pairing
    from fixtures.models import MODELS as FIXTURES

    def refused(composition: str) -> bool:  # the composition, or it with the default executors
        return composition in unsupported or pairing(composition, DEFAULT_EXECUTORS) in unsupported

    if profile == "ci":
        yield from (c for c in CI if not refused(c.composition))
        return
    for composition in COMPOSITIONS:
        if refused(composition):
            continue
        for model in MODELS:
            tie = FIXTURES[model].ties[-1]
            for saved_at, world_size in PAIRS:
                cell = Cell(model, "real", composition, tie=tie, scenario="resume", world_size=world_size)
                yield dataclasses.replace(cell, saved_at=saved_at)

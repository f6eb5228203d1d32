"""The plan of plain ``thunder.jit`` on this rank: the cell's model compiled without any
distributed transform, on the same device, dtype and executors, run forward once on the
cell's input. What it saves for the backward is the reference the memory area holds the
distributed forward's plan to (``checks/memory/__init__.py``), with FSDP's arithmetic added there.

Compiled by rank 0 alone, once per (model, tie, dtype, executors) in its process, and handed
to the other ranks: nothing distributed runs in it, so every rank's would be the same, and
ranks compiling the same function side by side only share the cores (a world of 4 ranks on
2 cores took twice one compile's time). Only numbers are kept, and the plain module is
dropped before the cell's checks read anything."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.memory.dataflow import estimated_returned
from conformance.checks.record import PlainPlan
from conformance.checks.storages import distinct_storages
from conformance.rank.build import SEED, Recipe

_PLANS: dict[tuple[Any, ...], PlainPlan] = {}
_VARIANT: str | None = None  # which Thunder the plans are of (``variant``): None, the one installed


def plain_plan(recipe: Recipe) -> PlainPlan:
    """Plain jit's forward plan for the recipe's model: rank 0's (cached per key in its
    process), broadcast to the world. Every rank calls it, as a collective."""
    cell = recipe.cell
    # everything _compile reads: the model as recipe.make builds it (tied, checkpointed), its
    # dtype, executors and device; a plan keyed on less is another cell's (a checkpointed block
    # saves its input alone)
    key = (
        _VARIANT, cell.model, cell.spec, cell.tie, cell.checkpointing, cell.dtype, cell.executors, recipe.device.type
    )
    plan = [None]
    if dist.get_rank() == 0:
        if key not in _PLANS:
            try:
                _PLANS[key] = _compile(recipe)
            except Exception as exc:  # plain jit raising is the Thunder under test's: the plan says so
                _PLANS[key] = PlainPlan(error=f"{type(exc).__name__}: {exc}")
        plan = [_PLANS[key]]
    dist.broadcast_object_list(plan, src=0)
    return plan[0]


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Plans made in the block are another Thunder's (the kit's tests patch one in per cell,
    in worlds that outlive the patch): cached apart, neither taken from nor given to the
    Thunder outside it."""
    global _VARIANT
    outer, _VARIANT = _VARIANT, name
    try:
        yield
    finally:
        _VARIANT = outer


def _compile(recipe: Recipe) -> PlainPlan:
    import thunder

    torch.manual_seed(SEED)
    with torch.device(recipe.device):
        model = recipe.make().to(recipe.dtype)
    x = recipe.fixture.make_input(torch.Generator().manual_seed(SEED), recipe.dtype).to(recipe.device)
    tm = thunder.jit(model, **recipe.executors.jit_options())
    out = tm(x)
    node = out.grad_fn
    saved = list(node.saved_tensors) if node is not None and hasattr(node, "saved_tensors") else []
    storages = {t.untyped_storage().data_ptr(): n for n, t in distinct_storages(model).items()}
    parameters = sorted({storages.get(t.untyped_storage().data_ptr()) for t in saved if t is not None} - {None})
    plan = PlainPlan(
        returned=estimated_returned(thunder.last_traces(tm)[-1], recipe.device),
        saved_parameters=parameters,
    )
    del tm, out, node, saved, model, x
    gc.collect()
    return plan

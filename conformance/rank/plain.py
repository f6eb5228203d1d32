"""The plan of plain ``thunder.jit`` on this rank: the cell's model compiled without any
distributed transform, on the same device, dtype and executors, run forward once on the
cell's input. What it saves for the backward is the reference the memory area holds the
distributed forward's plan to (``checks/memory.py``), with FSDP's arithmetic added there.

Compiled once per (model, tie, dtype, executors) in a rank process and reused by every cell
of the world with that key: only numbers are kept, and the plain module is dropped before
the cell's checks read anything."""

from __future__ import annotations

import gc
from typing import Any

import torch

from conformance.checks.dataflow import estimated_returned
from conformance.checks.record import PlainPlan
from conformance.checks.storages import distinct_storages
from conformance.rank.build import SEED, Recipe

_PLANS: dict[tuple[Any, ...], PlainPlan] = {}


def plain_plan(recipe: Recipe) -> PlainPlan:
    """Plain jit's forward plan for the recipe's model (cached per key in this process)."""
    cell = recipe.cell
    key = (cell.model, cell.spec, cell.tie, cell.dtype, cell.executors, str(recipe.device))
    if key not in _PLANS:
        _PLANS[key] = _compile(recipe)
    return _PLANS[key]


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

"""What a forward left alive, storage by storage, and what holds each: the output's autograd
graph (the output and every tensor a node saved for the backward) and the model's registered
parameters; and whether any storage it allocated holds a copy of a parameter's values.

Thunder's own transforms state what a forward keeps in one trace; under PyTorch's parallelism
the forward is FSDP2's or DDP's hooks, ThunderFX's compiled graphs and the eager code between
them, and what the backward will read is the autograd graph PyTorch's engine walks. A storage
alive beyond it is kept by something else (a cache, a hook, a compiled graph's own state). A
copy of a parameter outlives FSDP2's resharding: FSDP2 frees an unsharded parameter by
resizing its storage, which a saved reference does not prevent, but a copy keeps its bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from conformance.checks.record import ForwardHeld
from conformance.rank.measure import Ledger, plain_tensors, storage_identity
from conformance.rank.mixed import casts_made, computed_in


def before_forward(ledger: Ledger) -> set[int] | None:
    """The storages the ledger counts before a forward (None where it counts none one by one)."""
    storages = ledger.storages()
    return None if storages is None else set(storages)


def forward_held(
    out: Any,
    registered: Iterator[torch.Tensor],
    ledger: Ledger,
    before: set[int] | None,
    weights: Mapping[str, Any],
    compute: torch.dtype | None = None,
) -> ForwardHeld | None:
    """Read after a forward whose result is ``out``: ``registered`` are the model's parameters
    as registered now (FSDP2's unsharded ones where it keeps them after the forward),
    ``weights`` every parameter's full values as the step began, by name; ``compute``: the
    dtype the forward computed in (under FSDP2's mixed precision below the parameters': a copy
    may hold their values cast to it)."""
    storages = ledger.storages()
    if storages is None or before is None:
        return None
    made = {key: s for key, s in storages.items() if key not in before}
    holders = {storage_identity(t) for t in plain_tensors([out, *_saved(out)])}
    own = {storage_identity(t) for t in plain_tensors(list(registered))}
    held = holders | own
    copies: dict[str, int] = {}
    for key, storage in made.items():
        if key in own:
            continue
        for name, w in weights.items():
            if isinstance(w, torch.Tensor) and _holds_values(storage, w, compute):
                copies[name] = copies.get(name, 0) + storage.nbytes()
    return ForwardHeld(
        alive=sum(s.nbytes() for s in made.values()),
        graph=sum(s.nbytes() for key, s in made.items() if key in held),
        unheld=sorted((s.nbytes() for key, s in made.items() if key not in held and s.nbytes()), reverse=True),
        copies=copies,
    )


def copies_in_eager(module: torch.nn.Module, x: torch.Tensor, device: torch.device) -> dict[str, int]:
    """The parameters eager PyTorch's own forward of ``module`` on ``x`` leaves a copy of alive
    (the model's code may cast a weight, as litgpt's RMSNorm computes with
    ``weight.float()``): by name, bytes, as ``forward_held`` reads them. Under FSDP2's mixed
    precision (conformance/rank/mixed.py) the forward's casts of the parameters are what FSDP2
    gathers and registers for the forward, not copies: read as registered."""
    ledger = Ledger(device)
    before = before_forward(ledger)
    with ledger.phase(), casts_made(module) as casts:
        out = module(x)
    weights = {name: p.detach() for name, p in module.named_parameters()}
    found = forward_held(out, [*module.parameters(), *casts], ledger, before, weights, computed_in(module))
    return {} if found is None else found.copies


def _saved(out: Any) -> list[torch.Tensor]:
    """Every tensor the autograd graph behind ``out`` saved for the backward: a built-in
    node's ``_saved_*`` attributes, a custom Function's ``saved_tensors`` and attributes."""
    found: list[torch.Tensor] = []
    roots = [t.grad_fn for t in plain_tensors(out) if t.grad_fn is not None]
    # kept alive while walking: a node's Python object may be made for each access, and the id
    # of one already collected would be taken for a node seen
    seen: dict[int, Any] = {}
    while roots:
        node = roots.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        values = []
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    values.append(getattr(node, name))
                except RuntimeError:  # freed already, or not a tensor to unpack
                    continue
        with contextlib.suppress(AttributeError, RuntimeError):
            values.append(node.saved_tensors)
        # a custom Function's node is its ctx: what it keeps in attributes is the graph's too
        # (Thunder's ThunderFunction hands its saved tensors over through a ``side_channel`` dict)
        values.append(list(getattr(node, "__dict__", {}).values()))
        found.extend(plain_tensors(values))
        roots.extend(n for n, _ in node.next_functions)
    return found


def _holds_values(storage: torch.UntypedStorage, w: torch.Tensor, compute: torch.dtype | None = None) -> bool:
    """Whether ``storage`` begins with ``w``'s values or its transpose's, in ``w``'s dtype,
    float32 or ``compute``, and is no larger than twice ``w`` (a padded gathered copy fits). A
    constant parameter (a norm's ones, a zero-initialized adapter) tells nothing apart: never matched."""
    if w.numel() < 2 or w.device != storage.device or bool((w == w.flatten()[0]).all()):
        return False
    for dtype in dict.fromkeys((w.dtype, torch.float32, compute or w.dtype)):
        count = storage.nbytes() // dtype.itemsize
        if not w.numel() <= count <= 2 * w.numel():
            continue
        flat = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, 0, (count,))[: w.numel()]
        want = w.to(dtype)
        if torch.equal(flat.view(w.shape), want):
            return True
        if w.dim() == 2 and torch.equal(flat.view(w.shape[1], w.shape[0]), want.t()):
            return True
    return False

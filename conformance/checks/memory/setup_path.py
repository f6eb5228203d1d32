"""Setup's peak under meta init, along the path Thunder's MaterializationTransform takes
(thunder/transforms/materialization.py, the same in 0.2.1 to the pin).

First every parameter and buffer gets an empty tensor on the device (shards under FSDP): the
resident bytes, and each 0-d tensor beside them. Then, in ``named_modules`` order, each module
it initializes (every one that owns a tensor under module init; where a state dict follows,
only those owning a non-persistent buffer) is copied with its own tensors only, made
``to_empty`` on the device and ``reset_parameters()``-ed: eager's peak for exactly that is
measured on the rank (``conformance/rank/module_init.py``). While it runs, the previous
module's tensors are still alive (the loop's state dict holds them until it is reassigned).
Then the module's state dict is transformed, each parameter cut from a copy padded to the
world size and its shard kept until the load copies it in (FSDP only), and a buffer the
reset gave another dtype or shape is converted back. A state dict handed over afterwards is
loaded module by module the same way: unsharded ones cut into shards, sharded ones copied
in place.

A replaced buffer may leave its old tensor or its reset one alive until materialization
ends (the pin keeps the last old one through its loop variable; 0.2.1 stores the reset one
among the parameters): both are allowed, summed over the replaced buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import torch
from torch import nn

from conformance.checks.record import ModuleInit
from conformance.checks.storages import allocated_bytes, allocations, padded_bytes, piece_bytes


def materialized(module: nn.Module, non_persistent_only: bool) -> bool:
    """Whether Thunder's materialization initializes ``module`` on its own
    (``module_init_from_original_module_init``): under module init each module that owns a
    tensor, where a state dict follows only each that owns a non-persistent buffer."""
    if non_persistent_only:
        return bool(module._non_persistent_buffers_set)
    return any(True for _ in (*module.parameters(recurse=False), *module.buffers(recurse=False)))


@dataclasses.dataclass(frozen=True)
class SetupPath:
    """What a meta cell's setup allocates at its peak, by the path above; ``missing`` names
    a module whose initialization eager could not measure (no reset_parameters)."""

    resident: int  # every empty made first: shards (or whole tensors) and buffers, 0-d ones included
    materialization: int  # the most that initializing one module adds over them
    loading: int  # the most that loading the handed-over state dict adds over them
    lingering: int  # replaced buffers' tensors that may stay alive
    missing: str | None = None

    @property
    def peak(self) -> int:
        return self.resident + self.lingering + max(self.materialization, self.loading)


def setup_path(
    model: nn.Module,
    inits: list[ModuleInit],
    *,
    materialize: str,
    handed_over: str | None,
    resident: int,
    world: int | None,
    device: torch.device | str,
    only: Collection[str] | None = None,
) -> SetupPath:
    """``materialize``: "module", "original" or "transformed" (conformance.matrix.initialization);
    ``handed_over``: the state dict the kit hands over, if any; ``resident``: the shards (or
    whole tensors) and buffers without 0-d ones; ``world``: the pieces each parameter is cut
    in (None: not cut, DDP); ``only``: these modules alone are on meta (a partly-meta model's
    fresh part), the others real, sharded before."""
    scalars = allocations(
        (t.nbytes for t in {id(t): t for t in (*model.parameters(), *model.buffers())}.values() if t.dim() == 0),
        device,
    )
    measured = {i.name: i for i in inits}
    processed: set[int] = set()
    kept_before = materialization = lingering = 0
    missing = None
    for name, module in model.named_modules():
        if not materialized(module, non_persistent_only=materialize != "module"):
            continue
        if only is not None and name not in only:
            continue
        tensors = {**dict(module.named_parameters(recurse=False)), **dict(module.named_buffers(recurse=False))}
        if all(id(t) in processed for t in tensors.values()):  # every one tied to a loaded one: nothing made
            kept_before = 0
            continue
        processed.update(id(t) for t in tensors.values())
        init = measured.get(name)
        if init is None or init.peak is None or init.kept is None:
            missing = missing or (name or "the root module")
            continue
        materialization = max(materialization, kept_before + init.peak)
        params = [p for _, p in module.named_parameters(recurse=False)]
        cut = _cutting(params, world, device)
        model_buffers = dict(module.named_buffers(recurse=False))
        converted = max((allocated_bytes(model_buffers[n].nbytes, device) for n in init.replaced), default=0)
        materialization = max(materialization, init.kept + max(cut.peak, cut.kept + converted))
        lingering += sum(
            max(allocated_bytes(kept, device), allocated_bytes(model_buffers[n].nbytes, device))
            for n, kept in init.replaced.items()
        )
        kept_before = init.kept
    loading = 0
    if handed_over == "original":  # unsharded: each module's parameters cut into shards as they load
        loading = max(
            (_cutting([p for _, p in m.named_parameters(recurse=False)], world, device).peak for m in model.modules()),
            default=0,
        )
    return SetupPath(resident + scalars, materialization, loading, lingering, missing)


@dataclasses.dataclass(frozen=True)
class _Cut:
    peak: int  # the most alive at once while cutting
    kept: int  # the shards, alive until the load copies them in


def _cutting(params: list[torch.Tensor], world: int | None, device: torch.device | str) -> _Cut:
    """One module's parameters cut into this rank's shards, one after another (FSDP's
    ``_shard_tensor``): a copy padded to the world size where dim 0 needs padding, the shard
    cloned from it, the copy freed; the shards kept. Nothing under DDP."""
    if world is None:
        return _Cut(0, 0)
    peak = kept = 0
    for p in params:
        padded = padded_bytes(p, world)
        piece = piece_bytes(padded, world, device)
        copy = allocated_bytes(padded, device) if padded != p.nbytes else 0
        peak = max(peak, kept + copy + piece)
        kept += piece
    return _Cut(peak, kept)

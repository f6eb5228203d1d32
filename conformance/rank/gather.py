"""Full tensors from shards, gathered by the kit with plain ``torch.distributed`` (never
through Thunder's state-dict code), and detached CPU copies safe from later steps."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def rank_device() -> torch.device:
    """The device this rank's tensors and collectives live on: its GPU under nccl, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard(full: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's dim-0 chunk of ``full``, padded the way Thunder's FSDP pads."""
    chunk = -(-full.shape[0] // world)
    padded = torch.zeros((chunk * world, *full.shape[1:]), dtype=full.dtype, device=full.device)
    padded[: full.shape[0]] = full
    return padded[rank * chunk : (rank + 1) * chunk].clone()


def unshard(piece: torch.Tensor, full_shape: torch.Size) -> torch.Tensor:
    """Rebuild a full tensor from every rank's dim-0 shard (Thunder pads dim 0 to a multiple)."""
    world = dist.get_world_size()
    chunk = -(-full_shape[0] // world)
    assert tuple(piece.shape) == (chunk, *full_shape[1:]), (
        f"shard of shape {tuple(piece.shape)} does not fit a dim-0 sharding of {tuple(full_shape)} "
        f"over {world} ranks (expected {(chunk, *full_shape[1:])})"
    )
    parts = [torch.empty_like(piece) for _ in range(world)]
    dist.all_gather(parts, piece.detach().contiguous())
    return torch.cat(parts)[: full_shape[0]].cpu()


def whole(held: torch.Tensor, full_shape: torch.Size) -> torch.Tensor:
    """A tensor every rank holds whole (DDP), checked as ``unshard`` checks a shard."""
    assert tuple(held.shape) == tuple(full_shape), (
        f"a replicated tensor of shape {tuple(held.shape)}, expected the whole {tuple(full_shape)}"
    )
    return held.detach().cpu().clone()


def gather(
    tm: Any, shapes: dict[str, torch.Size], grads: bool = False, replicated: bool = False
) -> dict[str, torch.Tensor]:
    """Full parameters (or their gradients) of the Thunder module, by name. A gradient that
    no rank has (a frozen parameter's) is left out, as eager leaves it None; one that only
    some ranks have is gathered with NaN on the others, so the ranks issue the same
    collectives either way (one all-reduce first says which). ``replicated`` (DDP): every
    rank holds whole tensors, so this rank's are taken as they are."""
    params = {name: tm.get_parameter(name) for name in shapes}
    present = set(shapes)
    if grads:
        have = torch.tensor([p.grad is not None for p in params.values()], dtype=torch.int32, device=rank_device())
        dist.all_reduce(have)
        present = {name for name, n in zip(params, have.tolist(), strict=True) if n}
    out = {}
    world = dist.get_world_size()
    for name, shape in shapes.items():
        if name not in present:
            continue
        p = params[name]
        t = p.grad if grads else p
        local = tuple(shape) if replicated else (-(-shape[0] // world), *shape[1:])
        if t is None or t.is_meta:
            # what Thunder left unreadable (a parameter never materialized stays on the meta
            # device): NaN of the shape this rank should hold, so that the ranks still issue
            # the same collectives and every comparison of its values fails naming it (the
            # materialization area names the meta device)
            t = torch.full(local, float("nan"), dtype=p.dtype, device=rank_device())
        out[name] = whole(t, shape) if replicated else unshard(t, shape)
    return out


def snapshot(module: nn.Module, grads: bool = False) -> dict[str, torch.Tensor]:
    """CPU copies of an eager module's parameters (or gradients), by name."""
    named = ((n, p.grad if grads else p) for n, p in module.named_parameters())
    return cpu_copies((n, t) for n, t in named if t is not None)


def cpu_copies(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Detached CPU copies, safe from later training steps."""
    return {n: t.detach().cpu().clone() for n, t in named}


def on_every_rank(values: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Every rank's ``values`` (a few small CPU tensors, such as buffers), by rank: an object
    all-gather, as their shapes may differ from rank to rank, which a tensor collective forbids."""
    every: list[dict[str, torch.Tensor]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, values)
    return every


def identical(a: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Whether ``b`` is ``a``: the same shape, dtype and values."""
    return b is not None and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def clones(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached copies on the tensors' own devices."""
    return {k: v.detach().clone() for k, v in sd.items()}

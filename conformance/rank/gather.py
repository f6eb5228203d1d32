"""Full tensors from shards, gathered by the kit with plain ``torch.distributed`` (never
through Thunder's state-dict code), and detached CPU copies safe from later steps."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from conformance.checks.record import Apart
from fixtures import patterns


def rank_device() -> torch.device:
    """The device this rank's tensors and collectives live on: its GPU under nccl, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard(full: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's dim-0 chunk of ``full``, padded the way Thunder's FSDP pads."""
    chunk = patterns.chunk_rows(full.shape[0], world)
    padded = torch.zeros((chunk * world, *full.shape[1:]), dtype=full.dtype, device=full.device)
    padded[: full.shape[0]] = full
    return padded[rank * chunk : (rank + 1) * chunk].clone()


class Gathered(dict[str, torch.Tensor]):
    """Full tensors by name, and what some rank held that could not be gathered as it was
    (``defects``: name -> what was wrong, rank by rank); those gather as NaN where that rank's
    part goes, and every comparison of them (``Findings.close``) names why."""

    def __init__(self, tensors: dict[str, torch.Tensor], defects: dict[str, str]) -> None:
        super().__init__(tensors)
        self.defects = defects


def unshard(piece: torch.Tensor, full_shape: torch.Size, shard_ranks: tuple[int, ...] | None = None) -> torch.Tensor:
    """Rebuild a full tensor from every rank's dim-0 shard (Thunder pads dim 0 to a multiple);
    ``piece`` has the shape ``local_shape`` gives (``gather`` sees to it). ``shard_ranks``
    (hybrid sharding): the ranks whose shards make this rank's tensor, in order; every rank
    gathers from all, so that the world issues one collective."""
    world = dist.get_world_size()
    parts = [torch.empty_like(piece) for _ in range(world)]
    dist.all_gather(parts, piece.detach().contiguous())
    if shard_ranks is not None:
        parts = [parts[r] for r in shard_ranks]
    return torch.cat(parts)[: full_shape[0]].cpu()


def local_shape(full_shape: torch.Size, world: int, replicated: bool) -> tuple[int, ...]:
    """What a rank holds of a parameter: all of it (DDP) or its padded dim-0 shard (FSDP)."""
    return tuple(full_shape) if replicated else (patterns.chunk_rows(full_shape[0], world), *full_shape[1:])


def _defect(t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> str | None:
    """What keeps this rank's tensor from being gathered as it is, if anything."""
    if t.is_meta:  # never materialized (the materialization area names the meta device too)
        return "still on the meta device"
    if tuple(t.shape) != shape:
        return f"shape {tuple(t.shape)}, expected {shape}"
    if t.dtype != dtype:
        return f"dtype {t.dtype}, expected {dtype}"
    if t.device != device:
        return f"on {t.device}, expected {device}"
    return None


def gather(
    tm: Any,
    shapes: dict[str, torch.Size],
    grads: bool = False,
    replicated: bool = False,
    dtypes: dict[str, torch.dtype] | None = None,
    dtensors: bool = False,
    shard_ranks: tuple[int, ...] | None = None,
) -> Gathered:
    """Full parameters (or their gradients) of the Thunder module, by name. A gradient that
    no rank has (a frozen parameter's) is left out, as eager leaves it None; one that only
    some ranks have is gathered with NaN on the others, so the ranks issue the same
    collectives either way (one all-reduce first says which). ``replicated`` (DDP): every
    rank holds whole tensors, so this rank's are taken as they are. ``dtypes``: what each
    should be (the parameter's own dtype where not given). ``dtensors`` (PyTorch's
    parallelism): a tensor may be a DTensor, gathered by DTensor's own collective; the ranks
    first agree which are (one all-reduce), and one that is a DTensor on some ranks only is
    gathered as NaN on every rank without a collective, a defect naming it (else the ranks
    would issue different collectives and wait out the cell's timeout). ``shard_ranks``
    (hybrid sharding): the ranks that shard what this rank holds, its row of the mesh.

    Never crashes on what Thunder left: a tensor of the wrong shape, dtype or device, or on
    the meta device, is gathered as NaN of what this rank should hold (so that the ranks
    still issue the same collectives) and named in the result's ``defects``."""
    params = {name: _parameter(tm, name) for name in shapes}
    present = set(shapes)
    device = rank_device()
    if grads:
        have = [_held(p, grads) is not None for p in params.values()]
        have = torch.tensor(have, dtype=torch.int32, device=device)
        dist.all_reduce(have)
        present = {name for name, n in zip(params, have.tolist(), strict=True) if n}
    out: dict[str, torch.Tensor] = {}
    defects: dict[str, str] = {}
    world = dist.get_world_size() if shard_ranks is None else len(shard_ranks)
    held = {name: _held(params[name], grads) for name in shapes if name in present}
    mixed = _dtensors_on_some_ranks(held, device) if dtensors else {}
    for name, shape in shapes.items():
        if name not in present:
            continue
        p, t = params[name], held[name]
        whole = replicated or name in mixed or isinstance(t, DTensor)
        if name in mixed:  # no collective for it on any rank: NaN of the whole tensor everywhere
            t = None
        elif isinstance(t, DTensor):  # FSDP2's: its own layout, gathered by DTensor (every rank holds one)
            t = t.full_tensor()
        local = tuple(shape) if whole else local_shape(shape, world, replicated)
        dtype = (dtypes or {}).get(name, torch.float32 if p is None else p.dtype)
        absent = "missing from the Thunder module" if p is None else "no gradient"
        wrong = mixed.get(name) or (absent if t is None else _defect(t, local, dtype, device))
        if wrong is None:
            try:  # before any collective: a rank that cannot read its part still sends NaN
                t = t.detach().contiguous()
            except Exception as exc:
                wrong = f"a torch op on it raised {type(exc).__name__}: {exc}"
        if wrong is not None:
            defects[name] = wrong
            t = torch.full(local, float("nan"), dtype=dtype, device=device)
        out[name] = t.detach().cpu().clone() if whole else unshard(t, shape, shard_ranks)
    return Gathered(out, _merged_over_ranks(defects, device))


def _held(p: Any, grads: bool) -> Any:
    """The parameter, or its gradient, that this rank holds (None where it holds none)."""
    return None if p is None else p.grad if grads else p


def _dtensors_on_some_ranks(held: dict[str, Any], device: torch.device) -> dict[str, str]:
    """Name -> what this rank holds, for each tensor that is a DTensor on some ranks but not on
    every one (one all-reduce of a flag per name: every rank learns the same names)."""
    if not held:
        return {}
    flags = torch.tensor([isinstance(t, DTensor) for t in held.values()], dtype=torch.int32, device=device)
    dist.all_reduce(flags)
    world = dist.get_world_size()
    mixed = {}
    for (name, t), n in zip(held.items(), flags.tolist(), strict=True):
        if 0 < n < world:
            here = "a DTensor" if isinstance(t, DTensor) else "no tensor" if t is None else "a plain tensor"
            mixed[name] = f"{here}, where {n} of {world} ranks hold a DTensor"
    return mixed


def _parameter(tm: Any, name: str) -> Any:
    """The Thunder module's parameter ``name``, None where it has none."""
    try:
        return tm.get_parameter(name)
    except AttributeError:
        return None


def _merged_over_ranks(defects: dict[str, str], device: torch.device) -> dict[str, str]:
    """Every rank's defects, merged by name ("rank 1: shape (3, 4), expected (4, 4)"); one
    all-reduce says whether there are any to exchange."""
    count = torch.tensor([len(defects)], dtype=torch.int32, device=device)
    dist.all_reduce(count)
    if not count.item():
        return {}
    merged: dict[str, list[str]] = {}
    for rank, theirs in enumerate(on_every_rank(defects)):
        for name, what in theirs.items():
            merged.setdefault(name, []).append(f"rank {rank}: {what}")
    return {name: "; ".join(whats) for name, whats in merged.items()}


def snapshot(module: nn.Module, grads: bool = False) -> dict[str, torch.Tensor]:
    """CPU copies of an eager module's parameters (or gradients), by name."""
    named = ((n, p.grad if grads else p) for n, p in module.named_parameters())
    return cpu_copies((n, t) for n, t in named if t is not None)


def cpu_copies(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Detached CPU copies, safe from later training steps."""
    return {n: cpu_copy(t) for n, t in named}


def cpu_copy(t: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy. A tensor Thunder left on the meta device (the materialization area
    names where each tensor is), or one whose copy raises, has no values to copy: its copy
    holds NaN, or the dtype's lowest value, which no comparison takes for the value eager holds."""
    if not t.is_meta:
        try:
            return t.detach().cpu().clone()
        except Exception:  # a torch op on what Thunder made raised: it has no values either
            pass
    if t.is_floating_point() or t.is_complex():
        return torch.full(t.shape, float("nan"), dtype=t.dtype)
    return torch.full(t.shape, False if t.dtype == torch.bool else torch.iinfo(t.dtype).min, dtype=t.dtype)


def local_copies(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """CPU copies of a state dict's tensors, a DTensor's local shard for the DTensor."""
    return cpu_copies((k, getattr(v, "_local_tensor", v)) for k, v in state.items() if isinstance(v, torch.Tensor))


def padding_cleared(
    held: torch.Tensor, truth: torch.Tensor | None, full: torch.Size | None, rank: int
) -> torch.Tensor:
    """A shard with the rows past its parameter's end (``full``, the whole shape) zeroed, as
    the kit's own shard pads: what Thunder keeps in its padding is never read, so it is
    nobody's to check. A shard of another shape than ``truth`` is left as it is (the
    comparison names it)."""
    if full is None or truth is None or held.shape != truth.shape or not held.dim():
        return held
    valid = max(0, min(held.shape[0], full[0] - rank * held.shape[0]))
    cleared = held.clone()
    cleared[valid:] = 0
    return cleared


def on_every_rank(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``values`` (a few small CPU tensors, such as buffers), by rank: an object
    all-gather, as their shapes may differ from rank to rank, which a tensor collective forbids."""
    every: list[dict[str, Any]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, values)
    return every


def clones(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached copies on the tensors' own devices."""
    return {k: v.detach().clone() for k, v in sd.items()}


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size -> integer dtype


def _apart(mine: torch.Tensor, rank0s: torch.Tensor | None) -> tuple[int, float] | None:
    """How many elements of ``mine`` differ from rank 0's bit for bit, and by how much at
    most; None where none does. Bits, not values: a NaN equals itself, -0.0 is not 0.0."""
    if rank0s is None or mine.shape != rank0s.shape or mine.dtype != rank0s.dtype:
        return mine.numel(), float("nan")
    as_int = _BITS[mine.element_size()]
    differ = mine.reshape(-1).view(as_int) != rank0s.reshape(-1).view(as_int)
    count = int(differ.sum().item())
    if not count:
        return None
    gap = (mine.reshape(-1)[differ].double() - rank0s.reshape(-1)[differ].double()).abs()
    return count, float("nan") if gap.isnan().any() else gap.max().item()


def apart_from_rank0(named: dict[str, torch.Tensor]) -> dict[str, list[Apart]]:
    """Per name, every rank whose tensor (a replica's, CPU) differs from rank 0's bit for bit;
    a name no rank differs on is left out. Rank 0's tensors are broadcast once, each rank
    compares its own, and every rank learns every rank's answer."""
    theirs: list[Any] = [dict(named) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(theirs, src=0)
    mine = {n: _apart(t, theirs[0].get(n)) for n, t in named.items()}
    apart: dict[str, list[Apart]] = {}
    for rank, found in enumerate(on_every_rank({n: a for n, a in mine.items() if a is not None})):
        for name, (elements, largest) in found.items():
            apart.setdefault(name, []).append(Apart(rank, elements, largest))
    return apart

"""Live bytes in a trace, from its data flow alone: a tensor lives from its producer to its
last consumer (to the end, if returned), and views share their base's bytes. The ``del``
statements Thunder inserted are ignored, so a Thunder that stops freeing is caught rather
than explained away. On a CUDA device each storage counts as its allocator block
(``storages.allocated_bytes``), as the measurements it is set beside read it."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import torch

from conformance.checks.storages import allocated_bytes
from conformance.checks.traces import symbol_kinds
from transforms.policies import proxy_bytes

_ALIASES = {
    # names of executor and torch symbols whose outputs share their input's storage
    "unsqueeze", "squeeze", "transpose", "expand", "reshape", "view", "permute", "contiguous", "split",
    "chunk", "getitem", "narrow", "flatten", "unflatten", "t", "detach", "torch_prims_reshape_impl",
    "torch_wait_prim_impl", "shallow_copy", "broadcast_in_dim", "slice_prim",
    # basic slicing: FSDP unpads a gathered parameter so, keeping the padded storage under it
    "torch_slice_prim_impl",
}  # fmt: skip
# symbols that move a tensor to a device: no copy where it is already there (the reference
# offloading transform's ``load`` on a CPU world)
_MOVES = {"load"}


@dataclasses.dataclass
class Lifetime:
    nbytes: int
    born: int
    last: int
    device: str
    from_input: bool  # unpacked from the trace's arguments: allocated before it ran
    gathered: bool = False  # the output of an all-gather (an unsharded parameter under FSDP)


def lifetimes(trace: Any, not_returned: Collection[str] = ()) -> tuple[dict[str, Lifetime], int]:
    """Every storage the trace's tensors live in (named by the proxy that owns it), from its
    producer to its last consumer (``end`` if returned), and ``end``. The tensors named in
    ``not_returned`` are taken as returned through a copy made after their last use (as the
    offloading transform returns them), so their return does not keep their storage alive."""
    from thunder.core.prims import PrimIDs

    gathers = {k for k, kind in symbol_kinds().items() if kind == "all_gather"}
    tensors, unpacks = tensor_proxies, unpack_ids()
    root: dict[str, str] = {}  # proxy name -> name of the proxy that owns its storage
    lives: dict[str, Lifetime] = {}
    bsyms = [b for b in trace.bound_symbols if b.sym.id not in (PrimIDs.DEL,)]
    end = len(bsyms)
    for i, bsym in enumerate(bsyms):
        args = tensors(bsym.flat_proxy_args)
        for a in args:
            owner = root.get(a.name)
            if owner is not None:
                life = lives[owner]
                if bsym.sym.id != PrimIDs.RETURN:
                    life.last = max(life.last, i)
                elif a.name not in not_returned:
                    life.last = end
        if bsym.sym.id == PrimIDs.RETURN:
            continue
        outs = tensors(bsym.flat_proxy_outs)
        for out, base in zip(outs, aliased_inputs(bsym, args, outs, root), strict=True):
            if out.name in root:
                continue
            if base is not None:
                root[out.name] = root[base]
            else:
                root[out.name] = out.name
                lives[out.name] = Lifetime(
                    proxy_bytes(out), i, i, str(out.device), bsym.sym.id in unpacks, bsym.sym.id in gathers
                )
    return lives, end


def tensor_proxies(xs: Any) -> list[Any]:
    """The tensors (and collectives' future tensors) among a bound symbol's flat proxies."""
    from thunder.core.proxies import FutureTensorProxy, TensorProxy

    return [x for x in xs if isinstance(x, (TensorProxy, FutureTensorProxy))]


def unpack_ids() -> set[Any]:
    """Ids of the prims that bind a trace's inputs to names (its arguments, collections)."""
    from thunder.core.prims import PrimIDs

    return {v for k, v in PrimIDs.__members__.items() if k.startswith("UNPACK")}


def aliased_inputs(bsym: Any, args: list[Any], outs: list[Any], known: Collection[str]) -> list[str | None]:
    """For each of the bound symbol's tensor outputs, the name of the input whose storage
    it views (None: a new storage); only inputs in ``known`` (whose storage is tracked)."""
    name = bsym.sym.name
    if name == "update_aliases":  # returns its inputs themselves
        bases = [a.name for a in args]
    elif name == "copy_" and len(args) > 1:  # copies into its second argument and returns it
        bases = [args[1].name] * len(outs)
    elif args and (
        name in _ALIASES or (name in _MOVES and all(getattr(o, "device", None) == args[0].device for o in outs))
    ):
        bases = [args[0].name] * len(outs)  # ``Tensor.to`` a tensor's own device returns the tensor
    else:
        bases = []
    return [base if base in known else None for base in bases] + [None] * (len(outs) - len(bases))


def estimated_returned(
    trace: Any, device: torch.device, not_returned: Collection[str] = (), gathered_only: bool = False
) -> int:
    """Bytes on ``device`` the trace allocates and returns (a forward's outputs and what it
    saves for backward): what stays allocated between forward and backward. ``not_returned``:
    as ``lifetimes``' (the copies themselves are the caller's to count). ``gathered_only``:
    only the storages all-gathers made (views of them included), the unsharded parameters
    an FSDP forward keeps for its backward."""
    lives, end = lifetimes(trace, not_returned)
    return sum(
        allocated_bytes(life.nbytes, device)
        for life in lives.values()
        if life.last == end
        and not life.from_input
        and life.device == thunder_device(device)
        and (life.gathered or not gathered_only)
    )


def thunder_device(device: torch.device) -> str:
    from thunder.core.devices import to_device

    return str(to_device(device))

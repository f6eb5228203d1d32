"""Live bytes along a trace's plan: each tensor from the bound symbol that produces it until
the ``del`` that drops its last name (past the end if returned), views sharing their
base's storage. The trace is read as the promise of when each tensor exists, which the
runtime must keep; never as a bound on what the plan itself should be (the model-derived
bounds of the memory area judge that)."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from conformance.checks.memory.dataflow import aliased_inputs, tensor_proxies, thunder_device, unpack_ids
from conformance.checks.storages import allocated_bytes
from conformance.checks.traces import symbol_kinds
from transforms.policies import proxy_bytes

# an input proxy -> the owner and bytes of the storage it lives in, if the trace owns it
Handed = Callable[[Any], "tuple[str, int] | None"]


@dataclasses.dataclass
class Storage:
    """One storage the trace allocated, named by the proxy that owns it."""

    name: str
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    born: int  # index of the bound symbol that produced it
    dropped: int | None = None  # index of the ``del`` that dropped its last name (None: never)
    collective: str = ""  # the kind of collective that allocated it ("": none)


@dataclasses.dataclass
class Walk:
    """A trace's live bytes along its plan, relative to what was alive when it began."""

    peak: int  # the most alive at once, counting the bound symbol that runs at that moment
    end: int  # alive when the trace returns
    at_peak: list[str]  # the storages alive at the peak, by owner
    allocated: dict[str, Storage]  # every storage the trace allocated (counted on the device)
    owners: dict[str, str]  # every tensor name the trace binds -> the owner of its storage
    largest_gathered: int  # bytes of the largest storage an all-gather produced (0: none)
    prompt_peak: int  # the peak were each storage freed right after its last use
    # storages kept across an allocation after their last use: a plan that frees late, which
    # raises a peak wherever that allocation is the peak (on a real model, if not on the cell's)
    late: list[str]
    # of ``peak``, the copies a batched matmul may make of its operands (``_folding_copies``):
    # an upper bound, so the runtime's peak may be under the plan's by up to this much
    folding_at_peak: int = 0


def walk(trace: Any, device: torch.device, handed: Handed = lambda proxy: None) -> Walk:
    """Walk ``trace``'s bound symbols in order; only storages on ``device`` count, each as the
    device's reading counts it (``allocated_bytes``). A storage the trace allocates lives
    until no name views it. An input is its caller's, unless ``handed`` names the storage it
    lives in: a saved tensor or a gradient that the backward is handed and nothing else
    holds, freed the same way (inputs viewing one storage, one owner)."""
    from thunder.core.prims import PrimIDs

    tensors, unpacks, here = tensor_proxies, unpack_ids(), thunder_device(device)
    kinds = symbol_kinds()
    largest_gathered = 0
    root: dict[str, str] = {}  # live name -> the owner of its storage
    names: dict[str, int] = {}  # owner -> how many live names view it
    nbytes: dict[str, int] = {}  # owner -> bytes counted (0: not counted)
    allocated: dict[str, Storage] = {}
    returned: set[str] = set()
    owners: dict[str, str] = {}
    live = peak = folding_at_peak = 0
    alive: set[str] = set()  # owners counted and alive now
    at_peak: set[str] = set()
    last: dict[str, int] = {}  # owner -> index of the last bound symbol that reads or writes it
    freed: dict[str, int] = {}  # owner -> index of the ``del`` that freed it

    def drop(name: str, at: int) -> None:
        nonlocal live
        owner = root.pop(name, None)
        if owner is None:
            return
        names[owner] -= 1
        if names[owner] == 0 and owner not in returned:
            live -= nbytes[owner]
            alive.discard(owner)
            freed[owner] = at
            if owner in allocated:
                allocated[owner].dropped = at

    for i, bsym in enumerate(trace.bound_symbols):
        if bsym.sym.id == PrimIDs.DEL:
            for a in tensors(bsym.flat_proxy_args):
                drop(a.name, i)
            continue
        if bsym.sym.id == PrimIDs.RETURN:
            returned.update(root[a.name] for a in tensors(bsym.flat_proxy_args) if a.name in root)
            continue
        unpack = bsym.sym.id in unpacks
        for a in tensors(bsym.flat_proxy_args):
            if a.name in root:
                last[root[a.name]] = i
        outs = tensors(bsym.flat_proxy_outs)
        for out, base in zip(outs, aliased_inputs(bsym, tensors(bsym.flat_proxy_args), outs, root), strict=True):
            if out.name in root:
                continue
            if base is not None:
                owner = root[base]
            elif unpack:
                owner, counted = handed(out) or (out.name, 0)
                nbytes.setdefault(owner, counted)
                if counted:
                    alive.add(owner)
            else:
                owner = out.name
                counted = _counted(out, device, here)
                nbytes[owner] = counted
                dtype, kind = str(out.dtype).removeprefix("thunder.dtypes."), kinds.get(bsym.sym.id, "")
                allocated[owner] = Storage(owner, counted, tuple(out.shape), dtype, i, collective=kind)
                live += counted
                if counted:
                    alive.add(owner)
                if kind == "all_gather":
                    largest_gathered = max(largest_gathered, counted)
            root[out.name] = owners[out.name] = owner
            names[owner] = names.get(owner, 0) + 1
            last[owner] = i
        folding = _folding_copies(bsym, root, device, here)
        if live + folding > peak:
            peak, at_peak, folding_at_peak = live + folding, set(alive), folding
    for owner, count in names.items():  # never dropped, never returned: freed at the return
        if count and owner not in returned:
            freed.setdefault(owner, len(trace.bound_symbols))
    prompt = _prompt_peak(len(trace.bound_symbols), allocated, nbytes, last, freed)
    births = sorted(s.born for s in allocated.values() if s.nbytes)
    late = [
        f"{o} {_shape(allocated.get(o))}({nbytes[o]} B) used last at bound symbol {last[o]}, dropped at {freed[o]}"
        for o in sorted(freed, key=freed.get)
        if nbytes[o] and bisect.bisect_right(births, last[o]) < bisect.bisect_left(births, freed[o])
    ]
    return Walk(peak, live, sorted(at_peak), allocated, owners, largest_gathered, prompt, late, folding_at_peak)


# aten's matmul folds a batched operand's leading dims into one with ``reshape``, which copies
# an operand whose strides do not fold (q and k split out of one qkv projection, then
# transposed): the copies live while the product is computed. A trace's proxies carry no
# strides, so each batched operand that views another tensor's storage may have been copied:
# at that bound symbol the plan allows its bytes (measured: litgpt_llama's recomputed q @ k^T,
# two 1536 B copies, the checkpointed backward's peak, 2026-11-30)
_FOLDING = {"matmul"}


def _folding_copies(bsym: Any, root: dict[str, str], device: torch.device, here: str) -> int:
    """The bytes of the batched operands of a matmul that view another name's storage."""
    if bsym.sym.name not in _FOLDING:
        return 0
    return sum(
        _counted(a, device, here)
        for a in tensor_proxies(bsym.flat_proxy_args)
        if len(a.shape) >= 3 and root.get(a.name, a.name) != a.name
    )


def _shape(storage: Storage | None) -> str:
    return f"{storage.dtype}{list(storage.shape)} " if storage else ""


def _prompt_peak(
    n: int, allocated: dict[str, Storage], nbytes: dict[str, int], last: dict[str, int], freed: dict[str, int]
) -> int:
    """The trace's peak had each storage it frees been freed right after the last bound
    symbol that uses it (what ``del_last_used`` promises): the plan without late frees. A
    handed storage was alive when the trace began, so only its free counts."""
    change = [0] * (n + 1)
    for owner, counted in nbytes.items():
        if owner in allocated:
            change[allocated[owner].born] += counted
        if owner in freed:
            change[last[owner] + 1] -= counted
    live = peak = 0
    for delta in change[:n]:
        live += delta
        peak = max(peak, live)
    return peak


def _counted(proxy: Any, device: torch.device, here: str) -> int:
    """The proxy's bytes as ``device``'s reading counts them (none for another device;
    ``here``: the device as Thunder names it)."""
    return allocated_bytes(proxy_bytes(proxy), device) if str(proxy.device) == here else 0


def handed_to_backward(forward: Walk, device: torch.device) -> Handed:
    """What the backward owns of its inputs: the storages its forward allocated and saved
    (several saved views of one storage are one), and the gradients autograd hands it,
    which the forward never named. The forward's own inputs (parameters, the batch) stay
    their holders'."""
    here = thunder_device(device)

    def handed(proxy: Any) -> tuple[str, int] | None:
        owner = forward.owners.get(proxy.name)
        if owner is None:
            return proxy.name, _counted(proxy, device, here)
        if owner in forward.allocated:
            return owner, forward.allocated[owner].nbytes
        return None

    return handed


def sized(walk: Walk, nbytes: int, limit: int = 4) -> list[Storage]:
    """The storages of the plan of exactly ``nbytes`` that it drops before its end: what a
    runtime keeping one of them longer than planned would add."""
    return [s for s in walk.allocated.values() if s.nbytes == nbytes and s.dropped is not None][:limit]

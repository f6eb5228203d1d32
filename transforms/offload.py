"""Offloading of tensors saved for backward: a reference trace transform.

Written only against Thunder's public Transform API (after the CPU-offloading tutorial in
Thunder's repository, not copied from it). After optimization Thunder hands every transform
the forward trace and then the backward trace of one compilation:

- forward: the policy picks among the intermediates the forward saves for backward; each
  chosen tensor is copied to the destination device right after its last use, the original
  is deleted there, and the trace returns the copy in its place;
- backward: the unpacked copies are loaded back to the source device right before their
  first use, and the loads (with the shape-only ops that follow them) are sunk next to the
  computation that needs them, so a load does not hold device memory early.

Source and destination are parameters: CUDA to pinned CPU memory on GPUs; on CPU-only
machines CPU to CPU still exercises the whole rewrite.

    jitted = thunder.jit(model, transforms=[OffloadTransform(policies.All(), source="cuda")])
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from thunder.core import prims
from thunder.core.devices import to_device
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag, from_trace, tracectx
from thunder.core.transform_common import Transform
from thunder.core.vjp_utils import get_saved_for_backward_tensors
from thunder.executors import passes
from thunder.executors.pythonex import clear_mutable_collection
from thunder.extend import OperatorExecutor

from transforms.policies import Policy

HEADER = "offloaded by transforms.offload"

# Storages this transform created on the destination device, so a test can tell an
# offloaded saved tensor from another one even where both devices are the CPU.
_offloaded: dict[int, weakref.ref] = {}


def _copy_out(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    pinned = device.type == "cpu" and t.device.type == "cuda"
    out = torch.empty(t.shape, dtype=t.dtype, device=device, pin_memory=pinned)
    out.copy_(t)
    storage = out.untyped_storage()
    ptr = storage.data_ptr()
    _offloaded[ptr] = weakref.ref(storage, lambda _, ptr=ptr: _offloaded.pop(ptr, None))
    return out


def _offload_impl(t: torch.Tensor, device: str) -> torch.Tensor:
    return _copy_out(t, torch.device(device))


def _load_impl(t: torch.Tensor, device: str) -> torch.Tensor:
    return t.to(device, non_blocking=True)


def is_offloaded(t: torch.Tensor) -> bool:
    """Whether ``t`` lives in a storage this transform offloaded (and that is still alive)."""
    storage = t.untyped_storage()
    ref = _offloaded.get(storage.data_ptr())
    return ref is not None and ref() is not None


executor = OperatorExecutor("conformance_offload")
offload = executor.register_operator(
    "offload",
    meta=lambda t, device: TensorProxy(like=t, device=to_device(device)),
    fn=_offload_impl,
)
load = executor.register_operator(
    "load",
    meta=lambda t, device: TensorProxy(like=t, device=to_device(device)),
    fn=_load_impl,
)


@dataclasses.dataclass(frozen=True)
class Decision:
    """One compilation's offloading as this transform decided it: the forward trace Thunder
    handed it (before any offload; what it would save and return without offloading) and the
    names of the saved tensors it offloaded. A check judges the final trace and what autograd
    holds against this, so a Thunder pass after the transform cannot move the expectation."""

    forward: TraceCtx
    chosen: tuple[str, ...]


def saved_intermediates(trace: TraceCtx, saved: Sequence[TensorProxy], source: torch.device) -> list[TensorProxy]:
    """Offload candidates: tensors in ``saved`` (a forward trace's saved-for-backward, in
    order) that the trace computed on ``source``, neither inputs nor outputs, once each."""
    ret = trace.bound_symbols[-1].args[0]
    outside = {t.name for t in (*ret["flat_args"], *ret["flat_output"]) if isinstance(t, TensorProxy)}
    out, seen = [], set()
    for t in saved:
        if isinstance(t, TensorProxy) and t.name not in outside | seen and t.device == to_device(source):
            out.append(t)
            seen.add(t.name)
    return out


def unsupported() -> str | None:
    """Why the Thunder under test cannot run this transform, or None. It finds the saved
    tensors with ``get_saved_for_backward_tensors``, which needs the augmented forward trace
    tagged: Thunder 0.2.1 has no ``TraceTag.AUGMENTED_FORWARD`` (its own helper then raises)."""
    if not hasattr(TraceTag, "AUGMENTED_FORWARD"):
        return "this Thunder tags no augmented forward trace (no TraceTag.AUGMENTED_FORWARD), which offloading needs"
    return None


class OffloadTransform(Transform):
    """Offload the saved-for-backward tensors ``policy`` selects from ``source`` to
    ``destination`` between forward and backward."""

    def __init__(self, policy: Policy, *, source: str | torch.device = "cuda", destination: str | torch.device = "cpu"):
        self.policy = policy
        self.source = torch.device(source)
        self.destination = torch.device(destination)
        # from one compilation's forward to its backward: saved tensor name -> offloaded proxy
        self._pending: dict[str, TensorProxy] = {}
        self.decisions: list[Decision] = []  # every forward it was handed, in order

    def transform_trace_post_optimization(self, computation_trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        if TraceTag.AUGMENTED_FORWARD in computation_trace.tags:
            return self._offload_forward(computation_trace)
        # Some Thunders tag no backward trace (0.2.3 tags only the forward); Thunder hands a compilation's backward
        # right after its forward, and only a backward unpacks the saved tensors (which is
        # all _load_backward rewrites), so "something is pending" is the same test there.
        backward = getattr(TraceTag, "BACKWARD", None)
        if (backward in computation_trace.tags) if backward is not None else bool(self._pending):
            return self._load_backward(computation_trace)
        return computation_trace  # an inference trace saves nothing

    def _choose(self, candidates: list[TensorProxy], trace: TraceCtx) -> Sequence[TensorProxy]:
        return self.policy.select(candidates, trace)

    def _offload_forward(self, trace: TraceCtx) -> TraceCtx:
        saved = get_saved_for_backward_tensors(trace)
        chosen = self._choose(saved_intermediates(trace, saved, self.source), trace)
        self._pending = {}
        self.decisions.append(Decision(trace, tuple(t.name for t in chosen)))
        if not chosen:
            return trace
        bsyms = trace.bound_symbols
        last_use = {}
        for i, bsym in enumerate(bsyms[:-1]):  # the return is not a use, nor is a del
            if bsym.sym.id != prims.PrimIDs.DEL:
                for t in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs):
                    last_use[t.name] = i
        for name, i in last_use.items():
            # after the dels that follow the last use: what that use freed is freed before
            # the copy allocates (else the plan keeps it across an allocation)
            while bsyms[i + 1].sym.id == prims.PrimIDs.DEL:
                i += 1
            last_use[name] = i
        new = from_trace(trace)
        after: dict[int, list[BoundSymbol]] = {}
        for t in chosen:
            new.push_scope([])
            with tracectx(new):
                copy = offload(t, str(self.destination))
                prims.python_del(t)
            offloading, delete = new.pop_scope()
            offloading.header = HEADER
            after.setdefault(last_use[t.name], []).extend((offloading, delete))
            self._pending[t.name] = copy
        body = []
        for i, bsym in enumerate(bsyms[:-1]):
            body.append(bsym)
            body.extend(after.get(i, ()))
        swap = {variableify(t): self._pending[t.name] for t in chosen}
        new.bound_symbols = [*body, bsyms[-1].from_bsym_swap_proxies(swap, skip_output=True)]
        new.set_provenance(TraceProvenance(f"Offload to {self.destination}"))
        return new

    def _load_backward(self, trace: TraceCtx) -> TraceCtx:
        if not self._pending:
            return trace
        pending, self._pending = self._pending, {}
        bsyms = []
        loads = []
        for bsym in trace.bound_symbols:
            outs = bsym.flat_proxy_outs
            if bsym.sym.id == prims.PrimIDs.UNPACK_SEQUENCE and any(o.name in pending for o in outs):
                # the backward unpacks the offloaded copies; each gets loaded under the old name
                swap = {variableify(o): pending[o.name] for o in outs if o.name in pending}
                bsym = bsym.from_bsym_swap_proxies(swap, skip_inputs=True, skip_subsymbols=True)
                for o in outs:
                    if o.name in pending:
                        loaded = load.bind(pending[o.name], str(self.source), output=o)
                        loaded.header = HEADER
                        loads.append(loaded)
            bsyms.append(bsym)
        new = from_trace(trace)
        new.bound_symbols = _sink(bsyms, loads)
        new.set_provenance(TraceProvenance(f"Load from {self.destination}"))
        # looked up on the module at each call, not bound at import: whatever del_last_used
        # Thunder runs for its own traces (a patched one included) runs for ours too, however
        # early this module was imported (the composition probe imports it before any cell)
        return passes.del_last_used(new, clear_mutable_collections=True)


def _sink(bsyms: list[BoundSymbol], floating: list[BoundSymbol]) -> list[BoundSymbol]:
    """``bsyms`` with each of ``floating`` (and every op that reads only what they produce,
    such as the reshapes between a load and its matmul) placed right before its first
    consumer that does real work. Dels and collection clears are left to ``del_last_used``."""
    kept = [b for b in bsyms if b.sym.id not in (prims.PrimIDs.DEL, clear_mutable_collection.id)]
    movable = {id(b) for b in floating}
    made = {o.name for b in floating for o in b.flat_proxy_outs}
    for b in kept:
        args = [a.name for a in b.flat_proxy_args if isinstance(a, TensorProxy)]
        if b.sym.id != prims.PrimIDs.RETURN and args and all(a in made for a in args):
            movable.add(id(b))
            made.update(o.name for o in b.flat_proxy_outs)
    maker = {o.name: b for b in (*floating, *kept) if id(b) in movable for o in b.flat_proxy_outs}
    placed: set[int] = set()
    out: list[BoundSymbol] = []

    def place(b: BoundSymbol) -> None:
        for a in b.flat_proxy_args:
            m = maker.get(getattr(a, "name", None))
            if m is not None and id(m) not in placed:
                place(m)
        placed.add(id(b))
        out.append(b)

    for b in kept:
        if id(b) not in movable:
            place(b)
    # what nothing consumes still runs, before the return
    rest = [b for b in (*floating, *kept) if id(b) not in placed]
    for b in rest:
        if id(b) not in placed:
            place(b)
    if rest:
        out.append(out.pop(next(i for i, b in enumerate(out) if b.sym.id == prims.PrimIDs.RETURN)))
    return out

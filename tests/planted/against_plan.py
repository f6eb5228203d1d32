"""Memory bugs the plan rows see (``conformance/checks/memory/against_plan.py``): a runtime that keeps
a tensor past its plan, and a distributed transform whose plan saves what plain
``thunder.jit`` of the same model does not. Every bounded memory row passes them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.planted.cells import ALL, DDP, FSDP, NONE, OFFLOADING, ZERO3_FSDP, Pred, has
from tests.planted.record import Expect, planted


@planted({"memory": Expect(ALL, NONE, "backward peak along the plan")})
@contextlib.contextmanager
def saved_tensors_kept_to_end() -> Iterator[None]:
    """Thunder's backward holds a reference to every saved tensor until it returns (the
    regression its ``ThunderFunction.backward`` guards against by emptying the list it
    hands over): each saved tensor lives to the end of the backward instead of its last use.
    Nothing outlives the backward and numerics are unchanged."""
    from thunder.executors.torch_autograd import ThunderFunction

    original = ThunderFunction.backward

    def backward(ctx: Any, *args: Any) -> Any:
        compiled = ctx.compiled_backward

        def holding(saved: list, cotangents: Any) -> Any:
            held = list(saved[0])  # noqa: F841 (held on purpose, to the end of the backward)
            return compiled(saved, cotangents)

        ctx.compiled_backward = holding
        return original(ctx, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderFunction, "backward", staticmethod(backward))
        yield


RAGGED_FSDP: Pred = lambda c: FSDP(c) and has("ragged")(c)  # noqa: E731


# mlp's fc2.weight (7 rows) is ragged on every world size and plain jit saves it (the input
# gradient needs it); a ragged parameter no backward uses leaves the saved tensors alone
@planted(
    {
        "memory": Expect(
            lambda c: RAGGED_FSDP(c) and c.model == "mlp" and not OFFLOADING(c),
            RAGGED_FSDP,
            "saved for the backward against plain jit",
        ),
        # the same row, for the forward handed to the offloading transform, where the profile
        # carries plain jit on offloading cells (not ci: matrix.profiles.carries_plain_jit)
        "offload": Expect(NONE, lambda c: RAGGED_FSDP(c) and OFFLOADING(c)),
    },
    cells=(lambda c: RAGGED_FSDP(c) and c.model == "mlp" and not OFFLOADING(c), DDP),
)
@contextlib.contextmanager
def unpadded_parameter_copied() -> Iterator[None]:
    """FSDP unpads a gathered parameter by copying its rows out instead of slicing a view of
    the all-gather's output: under ZERO2 the forward saves that copy for the backward, so its
    plan keeps the parameter twice for a moment and the saved copy reads as an activation.
    Values, collectives and what the runtime does against that plan are unchanged."""
    import thunder.torch as ltorch
    from thunder.distributed.transforms.fsdp_v2 import FSDPParamUnpaddingVisitor

    original = FSDPParamUnpaddingVisitor.__call__
    getitem = ltorch.getitem

    def call(self: Any, bsym: Any) -> Any:
        with pytest.MonkeyPatch.context() as inner:
            inner.setattr(ltorch, "getitem", lambda a, key: ltorch.clone(getitem(a, key)))
            return original(self, bsym)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FSDPParamUnpaddingVisitor, "__call__", call)
        yield


def _gathered(bsyms: list) -> set[str]:
    """Names of the gathered parameters in a forward trace: each all-gather's wait output and
    the views FSDP unpads it with."""
    futures, gathered = set(), set()
    for bsym in bsyms:
        name, args = bsym.sym.name, [getattr(a, "name", None) for a in bsym.flat_proxy_args]
        outs = [o.name for o in bsym.flat_proxy_outs]
        if name == "torch_all_gather_prim_impl":
            futures.update(outs)
        elif (name == "torch_wait_prim_impl" and futures & set(args)) or (
            name in ("torch_slice_prim_impl", "reshape", "view") and gathered & set(args)
        ):
            gathered.update(outs)
    return gathered


ZERO3_MLP: Pred = lambda c: ZERO3_FSDP(c) and c.model == "mlp" and not OFFLOADING(c)  # noqa: E731


@planted({"memory": Expect(ZERO3_MLP, FSDP, "forward plan frees at last use")}, cells=(ZERO3_MLP, DDP))
@contextlib.contextmanager
def gathered_parameter_freed_one_layer_late() -> Iterator[None]:
    """The forward's plan drops each gathered parameter one layer late: its ``del`` comes
    after the next bound symbol that uses another gathered parameter instead of right after
    its own last use. The runtime follows that plan, so values, collectives and the plan
    rows that hold the runtime to the trace are unchanged; the forward peaks higher."""
    import thunder.executors.passes as passes
    from thunder.core import prims

    original = passes.del_last_used

    def late(trace: Any, *, clear_mutable_collections: bool = False) -> Any:
        out = original(trace, clear_mutable_collections=clear_mutable_collections)
        if clear_mutable_collections:  # the backward's
            return out
        bsyms, gathered = list(out.bound_symbols), _gathered(out.bound_symbols)
        moved: set[int] = set()  # the dels already moved (once each: one layer late, not more)
        i = 0
        while i < len(bsyms):
            bsym = bsyms[i]
            held = [a for a in bsym.flat_proxy_args if bsym.sym.id == prims.PrimIDs.DEL and a.name in gathered]
            if id(bsym) in moved:
                held = []
            later = next(
                (
                    k
                    for k in range(i + 1, len(bsyms))
                    if bsyms[k].sym.id not in (prims.PrimIDs.DEL, prims.PrimIDs.RETURN)
                    and {a.name for a in bsyms[k].flat_proxy_args} & (gathered - {a.name for a in held})
                ),
                None,
            )
            if held and later is not None:
                rest = [a for a in bsym.flat_proxy_args if a.name not in {h.name for h in held}]
                bsyms.insert(later + 1, dropped := prims.python_del.bind(*held, output=None))
                moved.add(id(dropped))
                if rest:
                    bsyms[i] = prims.python_del.bind(*rest, output=None)
                else:
                    del bsyms[i]
                    continue
            i += 1
        out.bound_symbols = bsyms
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(passes, "del_last_used", late)
        yield


@planted(
    {
        "memory": Expect(lambda c: not OFFLOADING(c), OFFLOADING, "saved for the backward against plain jit"),
        # where the profile carries plain jit on offloading cells (not ci)
        "offload": Expect(NONE, OFFLOADING),
    },
    cells=(lambda c: FSDP(c) and not OFFLOADING(c), lambda c: DDP(c) and not OFFLOADING(c)),
)
@contextlib.contextmanager
def activation_saved_twice() -> Iterator[None]:
    """Where a distributed transform is at work (the traces hold collectives; plain jit's are
    untouched), the forward's plan saves its first activation twice for the backward: once as
    it is and once as a copy, which the backward unpacks and drops unused. Values,
    collectives and what the runtime does against that plan are unchanged; the forward
    keeps one activation more."""
    import thunder.transforms.autodiff as autodiff
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import tracectx
    from thunder.core.transforms import (
        _update_backward_with_new_saved_for_backward,
        _update_forward_with_new_saved_for_backward,
    )
    from thunder.core.utils import producers
    from thunder.executors import torchex

    original = autodiff.split_into_forward_and_backward

    def split(joint: Any) -> Any:
        forward, backward = original(joint)
        collectives = {t.id for t in (torchex.all_gather_prim_impl, torchex.reduce_scatter_prim_impl)}
        collectives.add(torchex.all_reduce_prim_impl.id)
        if not any(b.sym.id in collectives for b in (*forward.bound_symbols, *backward.bound_symbols)):
            return forward, backward  # plain jit's: the bug is the distributed transform's
        tensors, other = forward.output[1]
        made = producers(forward)
        # an activation: computed from the batch (the forward's first argument), not the batch itself
        derived = {forward.args[0].name}
        for bsym in forward.bound_symbols:
            if {getattr(a, "name", None) for a in bsym.flat_proxy_args} & derived:
                derived.update(o.name for o in bsym.flat_proxy_outs)
        first = next((t for t in tensors if t.name in derived and t.name != forward.args[0].name), None)
        if first is None:
            return forward, backward
        with tracectx(forward):
            copy = TensorProxy(like=first)
        at = forward.bound_symbols.index(made[first]) + 1
        forward.bound_symbols.insert(at, torchex.clone.bind(first, output=copy))
        saved = [*tensors, copy, *other]
        _update_forward_with_new_saved_for_backward(forward, saved)
        _update_backward_with_new_saved_for_backward(backward, saved)
        return forward, backward

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(autodiff, "split_into_forward_and_backward", split)
        yield


@planted(
    {"memory": Expect(FSDP, NONE, "backward returns its reduce-scatters' outputs")},
    cells=(lambda c: FSDP(c) and not OFFLOADING(c), DDP),
)
@contextlib.contextmanager
def reduce_scatter_output_copied() -> Iterator[None]:
    """FSDP's backward copies each reduce-scattered shard and returns the copy as the gradient
    (as a transform that makes its gradients contiguous by cloning would): the shard and its
    copy live together for a moment. Values, collectives and what the runtime does against
    that plan are unchanged."""
    import thunder.executors.passes as passes
    from thunder.core.proxies import TensorProxy
    from thunder.core.pytree import tree_map
    from thunder.core.trace import from_trace, tracectx
    from thunder.executors import torchex

    original = passes.del_last_used

    def copying(trace: Any, *, clear_mutable_collections: bool = False) -> Any:
        if not clear_mutable_collections:  # the forward's
            return original(trace)
        new, futures, copies = from_trace(trace), set(), {}
        bsyms = []
        for bsym in trace.bound_symbols[:-1]:
            bsyms.append(bsym)
            if bsym.sym.id == torchex.reduce_scatter_prim_impl.id:
                futures.update(o.name for o in bsym.flat_proxy_outs)
            elif bsym.sym.id == torchex.wait_prim_impl.id and {a.name for a in bsym.flat_proxy_args} & futures:
                [shard] = bsym.flat_proxy_outs
                with tracectx(new):
                    copies[shard.name] = TensorProxy(like=shard)
                bsyms.append(torchex.clone.bind(shard, output=copies[shard.name]))
        ret = trace.bound_symbols[-1]
        args = tree_map(lambda x: copies.get(getattr(x, "name", None), x), ret.args)
        new.bound_symbols = [*bsyms, ret.from_bsym(args=args)]
        return original(new, clear_mutable_collections=True)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(passes, "del_last_used", copying)
        yield

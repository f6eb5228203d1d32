"""Memory bugs the plan rows see (``conformance/checks/memory_plan.py``): a runtime that keeps
a tensor past its plan, and a distributed transform whose plan saves what plain
``thunder.jit`` of the same model does not. Every bounded memory row passes them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.planted.cells import ALL, DDP, FSDP, NONE, OFFLOADING, Pred, has
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
        )
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

"""Bugs in what DDP's transform does: while it sets the replicas up, and in the gradients
its all-reduce hands them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from conformance.checks.registry import AREAS
from tests.planted.cells import BF16, BF16_DDP, BF16_FSDP, BROADCAST, DDP, FSDP, NEGATIVE, NONE
from tests.planted.patching import smallest_gradient_reduced_upcast, thunder_steps
from tests.planted.record import Expect, planted


# Torch raises inside Thunder's broadcast while the setup is measured, through the kit's
# dispatch mode: every area of every DDP cell fails as Thunder's failure, naming Thunder's frame
# ("did not run to completion: Thunder raised at ...ddp_v2.py:N in transform_module"), never
# as the kit's error
@planted(
    {area: Expect(DDP, NONE, "Thunder raised at") for area in AREAS},
    # (not a negative cell: it stops at the model's refusal before DDP broadcasts)
    cells=(lambda c: c.composition == "ddp_jit", lambda c: c.composition == "jit_ddp" and not NEGATIVE(c), FSDP),
)
@contextlib.contextmanager
def ddp_broadcast_from_missing_rank() -> Iterator[None]:
    """DDP's transform broadcasts the replicas from a rank the world does not have (one past
    the last): torch refuses the root inside Thunder's ``transform_module``."""
    from thunder.distributed.transforms.ddp_v2 import DDPTransform

    original = DDPTransform.transform_module

    def transform_module(self: Any, model: Any) -> Any:
        self.broadcast_from = self.process_group.size()
        return original(self, model)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DDPTransform, "transform_module", transform_module)
        yield


# One ulp of one gradient element on one rank: every comparison with eager passes (1e-5 in
# float32), only the replicas' bitwise identity sees it. FSDP all-reduces no gradient.
@planted(
    {"numerics": Expect(DDP, NONE, "replicas at step 2 (SGD): gradients differ from rank 0's bit for bit")},
    cells=(lambda c: DDP(c) and not BF16(c), lambda c: c.composition == "jit_ddp", lambda c: DDP(c) and BF16(c), FSDP),
)
@contextlib.contextmanager
def ddp_gradient_one_ulp_on_last_rank() -> Iterator[None]:
    """At step 2, on the last rank only, the first gradient bucket DDP all-reduces comes out
    with its largest element one ulp further from zero (``torch.nextafter``): that rank's
    replica drifts from the others by one ulp."""
    import torch
    import torch.distributed as dist

    original, done = dist.all_reduce, [False]

    def nudge(out: torch.Tensor) -> None:
        flat = out.view(-1)
        i = flat.abs().argmax()
        away = torch.tensor(float("-inf") if flat[i] < 0 else float("inf"), dtype=flat.dtype)
        flat[i] = torch.nextafter(flat[i], away)
        done[0] = True

    class Nudged:
        """The collective's work, nudging the output once waited for (gloo writes it then)."""

        def __init__(self, work: Any, output: torch.Tensor) -> None:
            self.work, self.output = work, output

        def wait(self, *args: Any, **kwargs: Any) -> Any:
            result = self.work.wait(*args, **kwargs)
            if not done[0]:
                nudge(self.output)
            return result

    def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        work = original(tensor, *args, **kwargs)
        # step 2's backward (its forward is the third); the kit's own all-reduces count integers
        if done[0] or begun[0] != 3 or not tensor.is_floating_point() or dist.get_rank() != dist.get_world_size() - 1:
            return work
        if work is None:
            nudge(tensor)
            return None
        return Nudged(work, tensor)

    with thunder_steps() as begun, pytest.MonkeyPatch.context() as mp:
        mp.setattr(dist, "all_reduce", all_reduce)
        yield


# DDP's counterpart of fsdp_transform.reduce_scatter_upcast: only the all-reduce's dtypes and
# bytes see it, on bfloat16 DDP cells
@planted(
    {"collectives": Expect(BF16_DDP, NONE, "backward all_reduce dtypes: expected the gradients' dtype bfloat16")},
    cells=(BF16_DDP, lambda c: DDP(c) and not BF16(c), BF16_FSDP),
)
@contextlib.contextmanager
def all_reduce_upcast() -> Iterator[None]:
    """DDP's backward upcasts the smallest bfloat16 gradient to float32 before its all-reduce
    and casts the result back: one all-reduce in float32, twice its bytes."""
    with smallest_gradient_reduced_upcast("thunder.distributed.transforms.ddp_v2:DDPTransform", "REPLICATED"):
        yield


class _AsyncBroadcasts:
    """torch.distributed as DDP's transform sees it, but for a broadcast made asynchronous
    whose Work is dropped (everything else is the module's, looked up at each call)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        self._real.broadcast(*args, **{**kwargs, "async_op": True})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


# The census's survivor at ddp_v2.py:81 (async_op=True for the buffers' broadcast): on gloo the
# values land before anyone reads them, so only the wait itself can show it.
@planted(
    {"collectives": Expect(lambda c: DDP(c) and BROADCAST(c), NONE, "setup: broadcast: issued asynchronously")},
    cells=(lambda c: DDP(c) and BROADCAST(c), lambda c: FSDP(c) and BROADCAST(c)),
)
@contextlib.contextmanager
def ddp_broadcast_never_waited() -> Iterator[None]:
    """DDP's transform broadcasts the replicas' parameters and buffers asynchronously and never
    waits on them: on NCCL the first step may read them before they arrive."""
    from thunder.distributed.transforms import ddp_v2

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ddp_v2, "tdist", _AsyncBroadcasts(ddp_v2.tdist))
        yield

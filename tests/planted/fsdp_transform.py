"""Bugs in what FSDP's transform does around the shards: tied weights, the forward's
all-gathers, their order across ranks, frozen parameters, the broadcast of buffers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.planted.cells import (
    ALL,
    BF16,
    BF16_FSDP,
    BROADCAST,
    DDP,
    FROZEN,
    FROZEN_JIT_FSDP,
    FSDP,
    NONE,
    RANDOM_BUFFER,
    TIED,
    ZERO3_FSDP,
    Pred,
)
from tests.planted.patching import smallest_gradient_reduced_upcast
from tests.planted.record import Expect, planted


@contextlib.contextmanager
def _around_transform_module(
    before: Callable[[Any, Any], None] | None = None, after: Callable[[Any, Any], None] | None = None
) -> Iterator[None]:
    """FSDPTransform.transform_module with ``before(transform, model)`` and ``after(...)``
    around it."""
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    original = FSDPTransform.transform_module

    def transform_module(self: Any, model: Any) -> Any:
        if before is not None:
            before(self, model)
        result = original(self, model)
        if after is not None:
            after(self, model)
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FSDPTransform, "transform_module", transform_module)
        yield


# FSDP's transform only: a tied DDP cell never gathers (its collectives item there is the pin's
# known xfail, which a -x run passes over)
@planted({"collectives": Expect(lambda c: TIED(c) and FSDP(c), NONE, "forward all_gathers: expected")})
@contextlib.contextmanager
def duplicate_tied_all_gather() -> Iterator[None]:
    """Forget which parameters are tied: every name of a tied weight is gathered (Thunder #602)."""
    with _around_transform_module(after=lambda transform, model: setattr(transform, "shared_params_name", {})):
        yield


# A second non-conformance inside cells whose collectives an xfails entry already excuses
# (ZERO3: no backward re-gather, xfails.toml): the entry names other failures, so the item
# fails, not xfails, on exactly those cells.
@planted(
    {"collectives": Expect(lambda c: TIED(c) and ZERO3_FSDP(c), NONE, "forward all_gathers: expected")},
    cells=(
        lambda c: TIED(c) and ZERO3_FSDP(c),
        lambda c: not TIED(c) and ZERO3_FSDP(c),
        lambda c: TIED(c) and not ZERO3_FSDP(c),
    ),
)
@contextlib.contextmanager
def duplicate_tied_all_gather_under_zero3() -> Iterator[None]:
    """Under ZERO3 only, forget which parameters are tied: every name of a tied weight is
    gathered in the forward (one all-gather more than the model's storages)."""

    def forget(transform: Any, model: Any) -> None:
        if transform.sharding_strategy.name == "ZERO3":
            transform.shared_params_name = {}

    with _around_transform_module(after=forget):
        yield


# original_state_dict() unshards through the same broken all-gather
@planted(
    {
        "numerics": Expect(ALL, NONE, "output at step 0"),
        "state_dict": Expect(NONE, ALL),
        "memory": Expect(NONE, ALL),  # the planted gather allocates a temporary of its own
    }
)
@contextlib.contextmanager
def stale_forward_gather() -> Iterator[None]:
    """The all-gather hands back its input buffer's first rows for every shard (outputs wrong)."""
    import torch.distributed as dist

    original = dist.all_gather_into_tensor

    def all_gather_into_tensor(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        work = original(output, input, *args, **kwargs)
        if work is not None:
            work.wait()
        output.copy_(input.repeat(output.shape[0] // input.shape[0], *([1] * (input.dim() - 1))))
        return work

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dist, "all_gather_into_tensor", all_gather_into_tensor)
        yield


# only simulated worlds at scale show it (tests/planted/test_scale.py predicts the ranks)
@planted(at_scale=True)
@contextlib.contextmanager
def collective_order_by_rank() -> Iterator[None]:
    """Odd ranks issue the parameter gathers in reverse order: a real world would deadlock or
    gather mismatched buffers; every rank's trace is fine on its own."""
    import importlib

    import torch.distributed as dist

    utils = importlib.import_module("thunder.distributed.utils")  # the package's ``utils`` is thunder.core's
    original = utils.maybe_sort_waits

    def maybe_sort_waits(trace: Any) -> tuple[bool, Any]:
        changed, trace = original(trace)
        if dist.get_rank() % 2:
            bsyms = trace.bound_symbols
            # a parameter's gather reads only the trace's own arguments: any order executes
            where = [i for i, b in enumerate(bsyms) if "all_gather" in b.sym.name]
            for i, b in zip(where, reversed([bsyms[i] for i in where]), strict=True):
                bsyms[i] = b
        return changed, trace

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(utils, "maybe_sort_waits", maybe_sort_waits)
        yield


# A frozen base made trainable: named by materialization (requires_grad), numerics (a
# gradient eager does not have) and collectives (reduce-scatters for it); the training it
# then does moves memory and the state dict too. Under jit_fsdp Thunder's own prologue
# refuses the changed flag at the first call (a failure of every area: did not run).
@planted(
    {
        "materialization": Expect(
            FROZEN, NONE, "trainable parameters: requires_grad differs from eager's | did not run"
        ),
        "numerics": Expect(FROZEN, NONE, "present where eager has none | did not run"),
        "collectives": Expect(FROZEN, NONE, "backward reduce_scatters: expected | did not run"),
        "memory": Expect(NONE, FROZEN),
        "state_dict": Expect(NONE, FROZEN),
        # what the forward saves grows where a frozen parameter's gradient needs a tensor of its
        # own (root_owned's gain: its spread's input); lora's base under jit_fsdp
        "offload": Expect(NONE, FROZEN),
    },
    cells=(lambda c: FROZEN(c) and c.composition == "fsdp_jit", FROZEN_JIT_FSDP, lambda c: c.model == "mlp"),
)
@contextlib.contextmanager
def frozen_parameters_trained() -> Iterator[None]:
    """Sharding forgets ``requires_grad=False`` before Thunder traces (as if each new
    ``nn.Parameter`` were built without passing the flag on, at a point the trace then sees):
    a frozen base gets gradients, reduce-scatters and optimizer steps. (Flipping the flag only
    after tracing is refused by Thunder's own prologue at the first call instead.)"""

    def unfreeze(transform: Any, model: Any) -> None:
        for p in model.parameters():
            p.requires_grad_(True)

    with _around_transform_module(before=unfreeze):
        yield


# Replicated buffers that differ from rank to rank: only a model with a random buffer shows
# it; the ranks then train different functions, which numerics may see too.
# FSDP's broadcast only: a DDP cell broadcasts its buffers itself (the first -x run of this
# record on ci passed the DDP cell its old predicate named first)
FSDP_RANDOM_BUFFER_BROADCAST: Pred = lambda c: FSDP(c) and BROADCAST(c) and RANDOM_BUFFER(c)  # noqa: E731


@planted(
    {
        "materialization": Expect(FSDP_RANDOM_BUFFER_BROADCAST, NONE, "buffers on every rank"),
        "numerics": Expect(NONE, FSDP_RANDOM_BUFFER_BROADCAST),
    },
    cells=(
        FSDP_RANDOM_BUFFER_BROADCAST,
        lambda c: FSDP(c) and BROADCAST(c) and not RANDOM_BUFFER(c),
        lambda c: DDP(c) and BROADCAST(c) and RANDOM_BUFFER(c),
    ),
)
@contextlib.contextmanager
def buffers_not_broadcast() -> Iterator[None]:
    """FSDP's ``broadcast_from`` broadcasts the parameters but not the buffers: ranks that
    built the model from other weights keep their own buffers."""
    import torch
    import torch.distributed as dist

    original = dist.broadcast

    def broadcast(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensor, torch.nn.Parameter):
            return original(tensor, *args, **kwargs)
        return None  # async_op=False: nothing to wait for

    def patch(transform: Any, model: Any) -> None:
        dist.broadcast = broadcast

    def unpatch(transform: Any, model: Any) -> None:
        dist.broadcast = original

    try:
        with _around_transform_module(before=patch, after=unpatch):
            yield
    finally:
        dist.broadcast = original


# Numerically invisible (a float32 reduction rounds less than eager's bfloat16 one): only the
# backward's reduce-scatter dtypes and bytes see it, on bfloat16 cells; float32 and DDP cells
# take another path
@planted(
    {
        "collectives": Expect(
            BF16_FSDP, NONE, "backward reduce_scatter dtypes: expected the gradients' dtype bfloat16"
        ),
        # the gradient returned is the cast back, a copy of the shard (memory_plan's row)
        "memory": Expect(NONE, BF16_FSDP),
    },
    cells=(BF16_FSDP, lambda c: FSDP(c) and not BF16(c), lambda c: BF16(c) and not FSDP(c)),
)
@contextlib.contextmanager
def reduce_scatter_upcast() -> Iterator[None]:
    """FSDP's backward upcasts the smallest bfloat16 gradient to float32 before its
    reduce-scatter and casts the shard back: one reduce-scatter in float32, twice its bytes."""
    with smallest_gradient_reduced_upcast("thunder.distributed.transforms.fsdp_v2:FSDPTransform", "FULLY_SHARDED"):
        yield


# issue 59's mutant: a membership test turned around in FSDP's unpadding visitor
# (``in self.swap_map`` made ``not in``). An op whose tensor arguments are all padded parameters
# then reads the padded whole: root_owned's frozen gain, the spread of 5 values (padded at every
# world size above 1), takes a zero in and scales the output by another spread; every op that
# also reads an activation is unpadded as before, so no other model of the registry sees it
PADDED_READ_ALONE: Pred = lambda c: FSDP(c) and c.model == "root_owned"  # noqa: E731


@planted(
    {"numerics": Expect(PADDED_READ_ALONE, NONE, "output at step 0")},
    cells=(PADDED_READ_ALONE, lambda c: FSDP(c) and c.model != "root_owned"),
)
@contextlib.contextmanager
def unpadding_skips_ops_of_padded_parameters_alone() -> Iterator[None]:
    """FSDP's unpadding visitor leaves an op be where every tensor it reads is a padded
    parameter: the op computes on the padding too (a mean over one zero row more)."""
    from thunder.core.proxies import TensorProxy, variableify
    from thunder.core.transforms import VISIT_TYPE
    from thunder.distributed.transforms.fsdp_v2 import FSDPParamUnpaddingVisitor

    original = FSDPParamUnpaddingVisitor.__call__

    def visit(self: Any, bsym: Any) -> Any:
        tensors = [a for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)]
        padded = [variableify(a) in self.swap_map for a in tensors]
        if bsym not in self.prod_bsym_to_unsharded_and_padding and padded and all(padded):
            return VISIT_TYPE.NO_OP
        return original(self, bsym)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FSDPParamUnpaddingVisitor, "__call__", visit)
        yield

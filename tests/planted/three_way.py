"""Bugs that need three things together: a feature of the model (conformance/matrix/features.py),
the transform family that mishandles it and what is done with the module. ci's pairwise
array alone holds no cell with all three for any of them; its coverage contract
(conformance/matrix/contract.py) does (tests/planted/test_three_way.py shows both)."""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from tests.planted.cells import ACCUMULATE, DDP, FROZEN, FSDP, NONE, RESHAPE, RESUME, TIED, TRAINED_BUFFER
from tests.planted.record import Expect, planted

FSDP_RESUME_TRAINED = lambda c: RESUME(c) and FSDP(c) and TRAINED_BUFFER(c)  # noqa: E731


# trained_buffer x FSDP x resume: a fresh module's buffers hold their initial values, which only
# a buffer training moved (running statistics) differs from; DDP loads through load_state_dict
@planted(
    {"state_dict": Expect(FSDP_RESUME_TRAINED, NONE, "checkpoint resumed: buffers after loading")},
    cells=(
        FSDP_RESUME_TRAINED,
        lambda c: RESUME(c) and DDP(c) and TRAINED_BUFFER(c),
        lambda c: RESUME(c) and FSDP(c) and not TRAINED_BUFFER(c),
    ),
)
@contextlib.contextmanager
def fsdp_full_load_keeps_fresh_buffers() -> Iterator[None]:
    """``load_model_state_dict`` of a full checkpoint into an FSDP module (its
    ``load_original_state_dict`` path) loads the parameters and leaves every buffer at the
    fresh module's values: running statistics restart after a resume."""
    import thunder.distributed.checkpoint as checkpoint

    original = checkpoint.load_model_state_dict

    def load_model_state_dict(state_dict: dict[str, Any], module: Any, options: Any, rank: int) -> None:
        if options.full_state_dict and checkpoint.has_fsdp_modules(module):
            buffers = {n.lstrip(".") for n, _ in module.named_buffers()}
            state_dict = {k: v for k, v in state_dict.items() if k.lstrip(".") not in buffers}
        return original(state_dict, module, options, rank)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "load_model_state_dict", load_model_state_dict)
        yield


DDP_ACCUMULATE_FROZEN = lambda c: ACCUMULATE(c) and DDP(c) and FROZEN(c)  # noqa: E731


# frozen x DDP x accumulate: only the sync on leaving no_sync walks the parameters, and only a
# frozen one has no gradient to stop at; FSDP's sync takes another branch
@planted(
    {"numerics": Expect(DDP_ACCUMULATE_FROZEN, NONE, "gradients accumulated over 2 micro-steps [")},
    cells=(
        DDP_ACCUMULATE_FROZEN,
        lambda c: ACCUMULATE(c) and DDP(c) and not FROZEN(c),
        lambda c: not ACCUMULATE(c) and DDP(c) and FROZEN(c),
    ),
)
@contextlib.contextmanager
def ddp_sync_stops_at_frozen_parameter() -> Iterator[None]:
    """The gradient sync on leaving ``no_sync()`` of a DDP module all-reduces the parameters'
    gradients up to the first parameter without one (a frozen one) and stops there: what the
    skipped micro-steps accumulated for every later parameter stays this rank's own."""
    import thunder.distributed

    original = thunder.distributed._sync_grads

    def _sync_grads(module: Any) -> None:
        if not getattr(module, "use_ddp", False):
            return original(module)
        parameters = list(module.parameters())
        first = next((i for i, p in enumerate(parameters) if p.grad is None), len(parameters))
        later = {i: parameters[i].grad for i in range(first, len(parameters))}
        for i in later:
            parameters[i].grad = None
        try:
            return original(module)
        finally:
            for i, grad in later.items():
                parameters[i].grad = grad

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(thunder.distributed, "_sync_grads", _sync_grads)
        yield


DDP_RESHAPE_TIED = lambda c: RESHAPE(c) and DDP(c) and TIED(c)  # noqa: E731


# tie x DDP x reshape: training's computation is right, and so is a second shape's of FSDP or of
# a module without a shared weight
@planted(
    {"numerics": Expect(DDP_RESHAPE_TIED, NONE, "gradients at the second input shape [")},
    cells=(
        DDP_RESHAPE_TIED,
        lambda c: RESHAPE(c) and DDP(c) and not TIED(c),
        lambda c: RESHAPE(c) and FSDP(c) and TIED(c),
    ),
)
@contextlib.contextmanager
def ddp_second_shape_sums_with_shared_weight() -> Iterator[None]:
    """The computation Thunder compiles for a second input shape of a DDP module that shares a
    weight between two layers all-reduces the gradients without dividing by the world size:
    they come out summed over the ranks, not averaged."""
    import torch
    from thunder.core import transforms
    from thunder.core.module import ThunderModule
    from thunder.core.proxies import DistParallelType
    from thunder.distributed.prims import DistributedReduceOps, PrimIDs, all_reduce

    shared_and_new = contextvars.ContextVar("shared_and_new", default=False)
    first_shapes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    original_forward = ThunderModule.forward
    original_backward = transforms.backward_impls[PrimIDs.SYNCHRONIZE]

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        named = list(self._model.named_parameters(remove_duplicate=False))  # the module as the user built it
        shared = len({id(p) for _, p in named}) < len(named)
        token = shared_and_new.set(shared and first_shapes.setdefault(self, shapes) != shapes)
        try:
            return original_forward(self, *args, **kwargs)
        finally:
            shared_and_new.reset(token)

    def backward(distparallel_type: Any, group: Any, grad: Any) -> Any:  # runs while Thunder traces
        if shared_and_new.get() and distparallel_type == DistParallelType.REPLICATED:
            return all_reduce(grad, DistributedReduceOps.SUM, group, do_async=True).wait(), None
        return original_backward(distparallel_type, group, grad)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "forward", forward)
        mp.setitem(transforms.backward_impls, PrimIDs.SYNCHRONIZE, backward)
        yield

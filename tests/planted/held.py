"""Bugs that keep a tensor past its use but not past the step: from the forward until its
backward begins (only what the forward leaves alive shows them: the memory area, or on cells
that offload the offload area's residency), or from the backward until the optimizer step
(the exact rows after the backward)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.planted.cells import DDP, FSDP, NONE, OFFLOADING, Pred
from tests.planted.patching import thunder_steps
from tests.planted.record import Expect, planted


@planted(
    {
        "memory": Expect(lambda c: not OFFLOADING(c), NONE, "memory held after forward"),
        "offload": Expect(OFFLOADING, NONE, "offloaded originals were kept"),
    }
)
@contextlib.contextmanager
def tensor_held_until_backward() -> Iterator[None]:
    """Every forward stashes one float (4 bytes) that a hook on its output releases when the
    backward begins: nothing outlives the step (the rows after the backward stay exact), and
    the forward's peak has room for it; only what is held after the forward shows it, exact
    on the CPU."""
    import torch

    kept: list[Any] = []

    def stash(tm: Any, out: Any) -> None:
        kept.append(torch.zeros(1, device=out.device))
        if out.requires_grad:
            out.register_hook(lambda grad: kept.clear())

    with thunder_steps(stash):
        yield


FSDP_PLAIN: Pred = lambda c: FSDP(c) and not OFFLOADING(c)  # noqa: E731
FSDP_OFFLOADING: Pred = lambda c: FSDP(c) and OFFLOADING(c)  # noqa: E731


@planted(
    {
        # where the cell offloads, the forward's peak along its plan may see the buffer too: it
        # is the size of gloo's late release of the same all-gather, which that row allows for,
        # so only a run where gloo released on time shows it (1,120 B over the plan, once in
        # two runs of the same infer cell: docs/measurements.md, session 29)
        "memory": Expect(FSDP_PLAIN, FSDP_OFFLOADING, "held after forward"),
        "offload": Expect(FSDP_OFFLOADING, NONE, "kept"),
    },
    cells=(FSDP_PLAIN, FSDP_OFFLOADING, DDP),
)
@contextlib.contextmanager
def gathered_unit_held_until_backward() -> Iterator[None]:
    """Each forward keeps a buffer the size of its largest all-gather (a gathered parameter
    the runtime holds though its trace frees it) until the backward begins. Inside the
    forward peak's room and gone before the step ends; DDP gathers nothing and conforms."""
    import torch
    import torch.distributed as dist
    from thunder.core.module import ThunderModule

    gather, forward = dist.all_gather_into_tensor, ThunderModule.forward
    inside, kept = [False], []

    def all_gather_into_tensor(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        if inside[0] and (not kept or output.numel() > kept[0].numel()):  # Thunder's, not the kit's
            kept[:] = [torch.empty_like(output)]
        return gather(output, input, *args, **kwargs)

    def thunder_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        inside[0] = True
        try:
            out = forward(self, *args, **kwargs)
        finally:
            inside[0] = False
        if out.requires_grad:
            out.register_hook(lambda grad: kept.clear())
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dist, "all_gather_into_tensor", all_gather_into_tensor)
        mp.setattr(ThunderModule, "forward", thunder_forward)
        yield


@planted({"memory": Expect(FSDP, NONE, "memory held after backward at step 0")}, cells=(FSDP, DDP))
@contextlib.contextmanager
def reduce_scatter_input_kept_until_step() -> Iterator[None]:
    """Every reduce-scatter's input (the unsharded gradient) is kept until the next optimizer
    step, not freed once reduced: inside every peak's room and gone when the step begins, so
    only what is held after the backward shows it. DDP all-reduces and conforms."""
    import torch.distributed as dist
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    original, kept = dist.reduce_scatter_tensor, []

    def reduce_scatter_tensor(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        kept.append(input)
        return original(output, input, *args, **kwargs)

    handle = register_optimizer_step_pre_hook(lambda *_: kept.clear())
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(dist, "reduce_scatter_tensor", reduce_scatter_tensor)
            yield
    finally:
        handle.remove()

"""Bugs planted into Thunder inside the ranks, to show that each check can fail.

Each bug is a context manager that monkeypatches Thunder in the rank process for the
duration of one cell; ``run_cell_with_bug`` is the rank-side entry point that wraps the
suite's own ``run_cell`` in it. Numerics and memory stay untouched unless the bug is about
them, so a bug shows up only in the check area (and the cells) it should.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def duplicate_tied_all_gather() -> Iterator[None]:
    """Forget which parameters are tied: every name of a tied weight is gathered (Thunder #602)."""
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    original = FSDPTransform.transform_module

    def transform_module(self: Any, model: Any) -> Any:
        result = original(self, model)
        self.shared_params_name = {}
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FSDPTransform, "transform_module", transform_module)
        yield


@contextlib.contextmanager
def gradients_not_averaged() -> Iterator[None]:
    """Reduce-scatter gradients without dividing by the world size first."""
    from thunder.core import transforms
    from thunder.distributed.prims import DistributedReduceOps, PrimIDs, reduce_scatter

    def backward(distparallel_type: Any, group: Any, grad: Any) -> Any:
        return reduce_scatter(grad, DistributedReduceOps.SUM, group, do_async=True).wait(), None

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(transforms.backward_impls, PrimIDs.SYNCHRONIZE, backward)
        yield


@contextlib.contextmanager
def wrong_shard() -> Iterator[None]:
    """Each rank keeps its neighbour's chunk of every parameter."""
    import thunder.distributed.transforms.fsdp_v2 as fsdp_v2

    original = fsdp_v2._shard_tensor

    def shard(param: Any, rank: int, world_size: int, *args: Any, **kwargs: Any) -> Any:
        return original(param, (rank + 1) % world_size, world_size, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp_v2, "_shard_tensor", shard)
        yield


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


BUGS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    f.__name__: f for f in (duplicate_tied_all_gather, gradients_not_averaged, wrong_shard, stale_forward_gather)
}


def run_cell_with_bug(bug: str, axes: dict[str, Any]) -> dict[str, Any]:
    from conformance.execute import run_cell

    with BUGS[bug]():
        return run_cell(axes)

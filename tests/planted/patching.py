"""Patching helpers more than one family of planted bugs uses."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def thunder_steps(after: Callable[[Any, Any], None] | None = None) -> Iterator[list[int]]:
    """Counts the Thunder module's forward calls (one per training step) and hands each
    call's module and output to ``after``: [steps begun]."""
    from thunder.core.module import ThunderModule

    original, begun = ThunderModule.forward, [0]

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        begun[0] += 1
        out = original(self, *args, **kwargs)
        if after is not None:
            after(self, out)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "forward", forward)
        yield begun


@contextlib.contextmanager
def each_compiled_graph(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """Every graph ThunderFX compiles from here on runs as ``wrap(graph)``: the wrapper sees
    each call's inputs and returns what the call returns (ThunderFX's split graph, its
    report of what reached Thunder untouched)."""
    from thunder.dynamo import compiler

    original = compiler._splitter

    def _splitter(gm: Any, *args: Any, **kwargs: Any) -> Any:
        split, info = original(gm, *args, **kwargs)
        return wrap(split), info

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiler, "_splitter", _splitter)
        yield


@contextlib.contextmanager
def smallest_gradient_reduced_upcast(transform_path: str, parallel_type: str) -> Iterator[None]:
    """Thunder's backward rule of ``synchronize`` (the gradient's reduction: FSDP's
    reduce-scatter, DDP's all-reduce) upcasts a low-precision gradient to float32 before
    reducing it and casts the result back, for the trainable parameter(s) with the fewest
    elements only: one collective per backward in the wrong dtype, a few bytes too many, and
    numerics as good or better (a float32 reduction rounds less). ``transform_path`` names the
    transform class (``module:Class``) whose ``transform_module`` shows the model's parameters;
    ``parallel_type`` the ``DistParallelType`` member whose reduction is changed."""
    import importlib

    import torch

    from fixtures import patterns

    module_name, class_name = transform_path.split(":")
    transform = getattr(importlib.import_module(module_name), class_name)
    from thunder.core import dtypes
    from thunder.core.transforms import backward_impls
    from thunder.distributed.prims import PrimIDs

    original_rule, original_transform = backward_impls[PrimIDs.SYNCHRONIZE], transform.transform_module
    smallest: set[tuple[int, ...]] = set()  # shapes of the trainable parameters with the fewest elements

    def transform_module(self: Any, model: Any) -> Any:
        trainable = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
        fewest = min((math.prod(s) for s in trainable), default=0)
        smallest.update(s for s in trainable if math.prod(s) == fewest)
        return original_transform(self, model)

    def reduced_shapes(world: int) -> set[tuple[int, ...]]:
        if parallel_type != "FULLY_SHARDED":
            return smallest
        return {(patterns.padded_rows(s[0], world), *s[1:]) if s else s for s in smallest}

    def rule(distparallel_type: Any, group: Any, grad: Any) -> Any:
        low = dtypes.to_torch_dtype(grad.dtype) in (torch.bfloat16, torch.float16)
        if distparallel_type.name != parallel_type or not low or tuple(grad.shape) not in reduced_shapes(group.size()):
            return original_rule(distparallel_type, group, grad)
        import thunder.torch as ltorch

        synced, rest = original_rule(distparallel_type, group, ltorch.to(grad, dtype=dtypes.float32))
        return ltorch.to(synced, dtype=grad.dtype), rest

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transform, "transform_module", transform_module)
        mp.setitem(backward_impls, PrimIDs.SYNCHRONIZE, rule)
        yield

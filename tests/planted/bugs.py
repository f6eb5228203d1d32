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


@contextlib.contextmanager
def duplicate_tied_all_gather() -> Iterator[None]:
    """Forget which parameters are tied: every name of a tied weight is gathered (Thunder #602)."""
    with _around_transform_module(after=lambda transform, model: setattr(transform, "shared_params_name", {})):
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


@contextlib.contextmanager
def one_module_not_materialized() -> Iterator[None]:
    """Materialization forgets the first module it should load: its tensors stay uninitialized."""
    from thunder.core.module import ThunderModule

    original = ThunderModule._transform_and_load_for_submodule
    skipped: list[str] = []

    def load(self: Any, submodule_name: str, state_dict: dict, *args: Any, **kwargs: Any) -> Any:
        if not skipped and any(k.endswith("weight") for k in state_dict):
            skipped.append(submodule_name)
            return None
        return original(self, submodule_name, state_dict, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "_transform_and_load_for_submodule", load)
        yield


@contextlib.contextmanager
def stale_original_state_dict() -> Iterator[None]:
    """original_state_dict() unshards by repeating this rank's shard instead of gathering."""
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    def reverse(self: Any, model: Any, submodule_name: str, state_dict: dict) -> dict:
        prefix = f"{submodule_name}." if submodule_name else ""
        for name, tensor in state_dict.items():
            if prefix + name in self.sharded_params:
                old_shape, *_ = self.sharded_params[prefix + name]
                state_dict[name] = tensor.repeat(self.world_size, *([1] * (tensor.dim() - 1)))[: old_shape[0]]
        return state_dict

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FSDPTransform, "reverse_transform_state_dict_for_submodule", reverse)
        yield


@contextlib.contextmanager
def _originals_kept_where(applies: Callable[[Any], bool]) -> Iterator[None]:
    """FSDP keeps the unsharded original parameters alive beside the shards, for the
    transforms ``applies`` picks."""
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    original = FSDPTransform.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if applies(self):
            self.release_original_parameters = False

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FSDPTransform, "__init__", init)
        yield


@contextlib.contextmanager
def originals_kept() -> Iterator[None]:
    """FSDP keeps the unsharded original parameters alive beside the shards (Thunder #478 class)."""
    with _originals_kept_where(lambda transform: True):
        yield


@contextlib.contextmanager
def full_model_before_sharding() -> Iterator[None]:
    """Module init materializes every parameter unsharded before it shards any of them."""
    import thunder.transforms.materialization as materialization
    import torch

    original = materialization.module_init_from_original_module_init

    def init(transform: Any, tm: Any, **kwargs: Any) -> Any:
        whole = [torch.zeros(p.shape, dtype=p.dtype, device=transform.device) for p in tm._model.parameters()]
        try:
            return original(transform, tm, **kwargs)
        finally:
            del whole

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(materialization, "module_init_from_original_module_init", init)
        yield


@contextlib.contextmanager
def shard_sources_copied() -> Iterator[None]:
    """Sharding works from a private copy of every parameter and drops the copies once all
    shards are cut: the setup peak doubles, nothing leaks past setup (meta copies hold no bytes)."""
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    original = FSDPTransform.transform_module

    def transform_module(self: Any, model: Any) -> Any:
        copies = [p.detach().clone() for p in model.parameters()]  # noqa: F841 (held on purpose)
        return original(self, model)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FSDPTransform, "transform_module", transform_module)
        yield


@contextlib.contextmanager
def intermediates_not_freed() -> Iterator[None]:
    """The executed traces lose their del statements: every intermediate lives to the end.
    (The clear_collection calls the same pass adds stay: Thunder's backward relies on them.)"""
    import thunder.executors.passes as passes
    from thunder.core.prims import PrimIDs

    original = passes.del_last_used

    def keep_everything(trace: Any, **kwargs: Any) -> Any:
        out = original(trace, **kwargs)
        out.bound_symbols = [b for b in out.bound_symbols if b.sym.id != PrimIDs.DEL]
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(passes, "del_last_used", keep_everything)
        yield


@contextlib.contextmanager
def backward_hook_not_called() -> Iterator[None]:
    """As if Thunder stopped handing backward traces to transform_trace_post_optimization:
    the offloading transform rewrites forwards only, nothing is ever loaded back."""
    from thunder.core.trace import TraceTag

    from transforms.offload import OffloadTransform

    original = OffloadTransform.transform_trace_post_optimization

    def forward_only(self: Any, trace: Any, **kwargs: Any) -> Any:
        return trace if TraceTag.BACKWARD in trace.tags else original(self, trace, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OffloadTransform, "transform_trace_post_optimization", forward_only)
        yield


@contextlib.contextmanager
def load_after_consumer() -> Iterator[None]:
    """Each load lands after the first op that needs the tensor, which reads the offloaded
    copy instead (same values on CPU to CPU; on CUDA the wrong device)."""
    from thunder.core.prims import PrimIDs
    from thunder.core.proxies import variableify
    from thunder.executors.passes import del_last_used
    from thunder.executors.pythonex import clear_mutable_collection

    from transforms.offload import OffloadTransform, load

    original = OffloadTransform._load_backward

    def late(self: Any, trace: Any) -> Any:
        new = original(self, trace)
        bsyms = [b for b in new.bound_symbols if b.sym.id not in (PrimIDs.DEL, clear_mutable_collection.id)]
        for bsym in [b for b in bsyms if b.sym.id == load.id]:
            loaded, copy = bsym.output, bsym.args[0]
            bsyms.remove(bsym)
            at = next(i for i, b in enumerate(bsyms) if loaded.name in {a.name for a in b.flat_proxy_args})
            bsyms[at] = bsyms[at].from_bsym_swap_proxies({variableify(loaded): copy})
            bsyms.insert(at + 1, bsym)
        new.bound_symbols = bsyms
        return del_last_used(new, clear_mutable_collections=True)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OffloadTransform, "_load_backward", late)
        yield


@contextlib.contextmanager
def policy_offloads_nothing() -> Iterator[None]:
    """The transform drops what its policy chose: nothing is offloaded."""
    from transforms.offload import OffloadTransform

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OffloadTransform, "_choose", lambda self, candidates, trace: ())
        yield


@contextlib.contextmanager
def offload_keeps_source() -> Iterator[None]:
    """Each offloaded copy holds on to the tensor it was copied from (as an asynchronous copy
    might, to keep its source alive): originals stay allocated until the backward."""
    import transforms.offload as offload

    original = offload._copy_out

    def copy_out(t: Any, device: Any) -> Any:
        out = original(t, device)
        out._source = t
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(offload, "_copy_out", copy_out)
        yield


@contextlib.contextmanager
def _during_module_init(patch: Callable[[Any, pytest.MonkeyPatch], None]) -> Iterator[None]:
    """Apply ``patch(thunder_module, monkeypatch)`` only while module init materializes the
    parameters (not for the non-persistent buffers, nor for later state-dict loads)."""
    import thunder.transforms.materialization as materialization

    original = materialization.module_init_from_original_module_init

    def init(transform: Any, tm: Any, *args: Any, non_persistent_only: bool = False, **kwargs: Any) -> Any:
        with pytest.MonkeyPatch.context() as inner:
            if not non_persistent_only:
                patch(tm, inner)
            return original(transform, tm, *args, non_persistent_only=non_persistent_only, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(materialization, "module_init_from_original_module_init", init)
        yield


def _linears(tm: Any, untied: bool = False) -> list[Any]:
    """The model's nn.Linear modules (``untied``: those whose weight no other module shares)."""
    from torch import nn

    uses: dict[int, int] = {}
    for _, p in tm._model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    linears = [m for m in tm._model.modules() if isinstance(m, nn.Linear)]
    return [m for m in linears if not untied or uses[id(m.weight)] == 1]


def _after_reset(mp: pytest.MonkeyPatch, marked: Any, change: Callable[[Any], None]) -> None:
    """After ``reset_parameters`` of the module copy Thunder makes of ``marked``, ``change`` it."""
    import torch
    from torch import nn

    marked._planted = True  # copy.copy carries it to Thunder's module copy
    reset = nn.Linear.reset_parameters

    def reset_parameters(self: Any) -> None:
        reset(self)
        if getattr(self, "_planted", False):
            with torch.no_grad():
                change(self)

    mp.setattr(nn.Linear, "reset_parameters", reset_parameters)


@contextlib.contextmanager
def module_init_draws_wider() -> Iterator[None]:
    """Module init draws the largest untied Linear weight from a uniform 5% wider than
    Linear.reset_parameters' (about 5% of its values land just outside the bound)."""

    def patch(tm: Any, mp: pytest.MonkeyPatch) -> None:
        largest = max(_linears(tm, untied=True), key=lambda m: m.weight.numel())
        _after_reset(mp, largest, lambda m: m.weight.mul_(1.05))

    with _during_module_init(patch):
        yield


@contextlib.contextmanager
def shards_copied_from_rank0() -> Iterator[None]:
    """Under module init every rank keeps rank 0's shard of the first weight (a 2-d parameter):
    in bounds and distributed right, but the ranks' shards are copies of one another."""
    import thunder.distributed.transforms.fsdp_v2 as fsdp_v2

    def patch(tm: Any, mp: pytest.MonkeyPatch) -> None:
        first = next(n for n, p in tm._model.named_parameters() if p.dim() == 2)
        original = fsdp_v2._shard_tensor

        def shard(param: Any, rank: int, world_size: int, name: str, *args: Any, **kwargs: Any) -> Any:
            return original(param, 0 if name == first else rank, world_size, name, *args, **kwargs)

        mp.setattr(fsdp_v2, "_shard_tensor", shard)

    with _during_module_init(patch):
        yield


@contextlib.contextmanager
def small_tensor_constant() -> Iterator[None]:
    """Module init fills the smallest Linear bias (or, in a model without biases, the smallest
    untied Linear weight) with one constant inside its bounds, a quarter of the way to
    1/√fan_in: on ≤ 7 values even a KS test against the exact uniform passes."""

    def patch(tm: Any, mp: pytest.MonkeyPatch) -> None:
        biases = [(m, "bias") for m in _linears(tm) if m.bias is not None]
        module, leaf = min(
            biases or [(m, "weight") for m in _linears(tm, untied=True)],
            key=lambda c: getattr(c[0], c[1]).numel(),
        )
        _after_reset(mp, module, lambda m: getattr(m, leaf).fill_(0.25 / m.in_features**0.5))

    with _during_module_init(patch):
        yield


@contextlib.contextmanager
def _thunder_steps(after: Callable[[Any, Any], None] | None = None) -> Iterator[list[int]]:
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
def _reduce_scatter_output(change: Callable[[Any], None]) -> Iterator[None]:
    """Every reduce-scatter's output goes through ``change`` once the collective is done."""
    import torch.distributed as dist

    original = dist.reduce_scatter_tensor

    class Changed:
        """The collective's work, changing the output once waited for (gloo writes the
        output when the work is waited for, not before)."""

        def __init__(self, work: Any, output: Any) -> None:
            self.work, self.output, self.changed = work, output, False

        def wait(self, *args: Any, **kwargs: Any) -> Any:
            result = self.work.wait(*args, **kwargs)
            if not self.changed:
                self.changed = True
                change(self.output)
            return result

    def reduce_scatter_tensor(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        work = original(output, input, *args, **kwargs)
        if work is None:
            change(output)
            return None
        return Changed(work, output)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dist, "reduce_scatter_tensor", reduce_scatter_tensor)
        yield


@contextlib.contextmanager
def gradient_off_later_step() -> Iterator[None]:
    """The reduced gradients of one later step (step 4, AdamW's second, whose update is
    nearly scale-invariant) come out 1% too large."""
    with _thunder_steps() as begun, _reduce_scatter_output(lambda out: out.mul_(1.01) if begun[0] == 5 else None):
        yield


@contextlib.contextmanager
def gradients_lost_later_step() -> Iterator[None]:
    """The reduced gradients of step 2 come out zero: that SGD step leaves the weights as they
    were (an update skipped)."""
    with _thunder_steps() as begun, _reduce_scatter_output(lambda out: out.zero_() if begun[0] == 3 else None):
        yield


@contextlib.contextmanager
def gradient_off_on_last_rank() -> Iterator[None]:
    """On the last rank only, every reduced gradient shard comes out 1% too large."""
    import torch.distributed as dist

    def change(out: Any) -> None:
        if dist.get_rank() == dist.get_world_size() - 1:
            out.mul_(1.01)

    with _reduce_scatter_output(change):
        yield


@contextlib.contextmanager
def bfloat16_gradients_scaled() -> Iterator[None]:
    """Reduced gradients in bfloat16 (and only those) come out 2% too large, as if a loss
    scale were undone with a rounded factor."""
    import torch

    with _reduce_scatter_output(lambda out: out.mul_(1.02) if out.dtype == torch.bfloat16 else None):
        yield


@contextlib.contextmanager
def shard_copy_kept() -> Iterator[None]:
    """The first forward keeps a copy of one parameter's shard (the largest) for good."""
    kept: list[Any] = []

    def keep(tm: Any, out: Any) -> None:
        if not kept:
            kept.append(max(tm.parameters(), key=lambda p: p.numel()).detach().clone())

    with _thunder_steps(keep):
        yield


@contextlib.contextmanager
def tensor_leaked_per_step() -> Iterator[None]:
    """Every forward leaves one small tensor (two float32 elements) behind."""
    import torch

    kept: list[Any] = []
    with _thunder_steps(lambda tm, out: kept.append(torch.zeros(2, device=out.device))):
        yield


@contextlib.contextmanager
def zero3_originals_kept() -> Iterator[None]:
    """Under ZERO3 only, FSDP keeps the unsharded original parameters beside the shards."""
    from thunder.distributed import FSDPType

    with _originals_kept_where(lambda transform: transform.sharding_strategy == FSDPType.ZERO3):
        yield


@contextlib.contextmanager
def bucketed_gradients_not_averaged() -> Iterator[None]:
    """With a bucketing strategy (and only then), gradients are summed over ranks, not averaged."""
    from thunder.core import transforms
    from thunder.distributed import FSDPBucketingStrategy
    from thunder.distributed.prims import DistributedReduceOps, PrimIDs, reduce_scatter
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    bucketed = [False]
    original_init, original_backward = FSDPTransform.__init__, transforms.backward_impls[PrimIDs.SYNCHRONIZE]

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        bucketed[0] = self.bucketing_strategy != FSDPBucketingStrategy.NONE

    def backward(distparallel_type: Any, group: Any, grad: Any) -> Any:
        if not bucketed[0]:
            return original_backward(distparallel_type, group, grad)
        return reduce_scatter(grad, DistributedReduceOps.SUM, group, do_async=True).wait(), None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FSDPTransform, "__init__", init)
        mp.setitem(transforms.backward_impls, PrimIDs.SYNCHRONIZE, backward)
        yield


# Bugs that sharding at scale shows (tests/test_scale.py runs them on simulated worlds).


def _padded_shard(param: Any, world_size: int, chunk: int, start: int) -> tuple[Any, int | None]:
    """``chunk`` rows of ``param`` from row ``start``, padded with zeros past its end."""
    import torch

    rows = max(chunk * world_size, param.shape[0])
    padded = torch.zeros((rows, *param.shape[1:]), dtype=param.dtype, device=param.device)
    padded[: param.shape[0]].copy_(param)
    return padded.narrow(0, start, chunk).clone(), (chunk * world_size - param.shape[0]) or None


@contextlib.contextmanager
def padding_when_divisible() -> Iterator[None]:
    """Dim 0 padded to the next multiple of the world size even when it is one already
    (``(D // N + 1) * N``): a chunk one row too long, only where N divides D."""
    import thunder.distributed.transforms.fsdp_v2 as fsdp_v2

    def shard(param: Any, rank: int, world_size: int, *args: Any, **kwargs: Any) -> Any:
        chunk = param.shape[0] // world_size + 1
        return _padded_shard(param, world_size, chunk, chunk * rank)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp_v2, "_shard_tensor", shard)
        yield


@contextlib.contextmanager
def offset_off_past_first_rank() -> Iterator[None]:
    """Every rank but the first cuts its shard one row early: each holds its predecessor's
    last row (shapes, collectives and bytes unchanged)."""
    import thunder.distributed.transforms.fsdp_v2 as fsdp_v2

    def shard(param: Any, rank: int, world_size: int, *args: Any, **kwargs: Any) -> Any:
        chunk = -(-param.shape[0] // world_size)
        return _padded_shard(param, world_size, chunk, max(0, chunk * rank - 1))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp_v2, "_shard_tensor", shard)
        yield


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


@contextlib.contextmanager
def no_grad_ignored() -> Iterator[None]:
    """The Thunder module ignores an enclosing ``torch.no_grad``: it runs (and caches) the
    training computation for inference, whose result then asks for a gradient."""
    import torch
    from thunder.core.module import ThunderModule

    original = ThunderModule.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            return original(self, *args, **kwargs)
        with torch.enable_grad():
            return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "forward", forward)
        yield


@contextlib.contextmanager
def second_shape_gradients_not_averaged() -> Iterator[None]:
    """A computation Thunder compiles for an input shape the module has not seen before
    reduce-scatters FSDP's gradients without averaging them over the ranks: the first shape's
    computation (every training step) is right, and so is DDP's."""
    import contextvars
    import weakref

    import torch
    from thunder.core import transforms
    from thunder.core.module import ThunderModule
    from thunder.core.proxies import DistParallelType
    from thunder.distributed.prims import DistributedReduceOps, PrimIDs, reduce_scatter

    recompiling = contextvars.ContextVar("recompiling", default=False)
    first_shapes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    original_forward = ThunderModule.forward
    original_backward = transforms.backward_impls[PrimIDs.SYNCHRONIZE]

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        token = recompiling.set(first_shapes.setdefault(self, shapes) != shapes)
        try:
            return original_forward(self, *args, **kwargs)
        finally:
            recompiling.reset(token)

    def backward(distparallel_type: Any, group: Any, grad: Any) -> Any:  # runs while Thunder traces
        # FSDP's sharded parameters only: DDP's replicated ones keep their all-reduce
        if recompiling.get() and distparallel_type == DistParallelType.FULLY_SHARDED:
            return reduce_scatter(grad, DistributedReduceOps.SUM, group, do_async=True).wait(), None
        return original_backward(distparallel_type, group, grad)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "forward", forward)
        mp.setitem(transforms.backward_impls, PrimIDs.SYNCHRONIZE, backward)
        yield


@contextlib.contextmanager
def no_sync_never_ends() -> Iterator[None]:
    """Leaving ``no_sync()`` forgets to reset the skip flag: every later step also skips the
    gradient sync (the micro-step meant to sync runs the skipped computation too)."""
    import thunder.distributed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(thunder.distributed, "reset_skip_data_parallel_grad_sync", lambda token: None)
        yield


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


@contextlib.contextmanager
def module_init_draws_per_rank() -> Iterator[None]:
    """Module init seeds each rank's generator by its rank before drawing: every shard is
    still a valid draw, but a replicated buffer drawn at random differs from rank to rank."""
    import torch
    import torch.distributed as dist

    with _during_module_init(lambda tm, mp: torch.manual_seed(4242 + dist.get_rank())):
        yield


@contextlib.contextmanager
def buffer_updates_dropped() -> Iterator[None]:
    """The forward's in-place updates of buffers are lost (as when a functionalized update is
    never written back): running statistics stay what setup made them."""
    import torch
    from thunder.core.module import ThunderModule

    original = ThunderModule.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = {n: b.detach().clone() for n, b in self.named_buffers()}
        try:
            return original(self, *args, **kwargs)
        finally:
            with torch.no_grad():
                for n, b in self.named_buffers():
                    if not torch.equal(b, before[n]):  # one the forward only read may be saved for backward
                        b.copy_(before[n])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "forward", forward)
        yield


@contextlib.contextmanager
def ddp_gradients_not_averaged() -> Iterator[None]:
    """DDP all-reduces gradients without dividing by the world size first (the sum, not the
    mean); FSDP's reduce-scatters are left as they are."""
    from thunder.core import transforms
    from thunder.core.proxies import DistParallelType
    from thunder.distributed import get_skip_data_parallel_grad_sync
    from thunder.distributed.prims import DistributedReduceOps, PrimIDs, all_reduce

    original = transforms.backward_impls[PrimIDs.SYNCHRONIZE]

    def backward(distparallel_type: Any, group: Any, grad: Any) -> Any:
        # a skipped sync stays skipped: only the sync itself is wrong
        if distparallel_type == DistParallelType.REPLICATED and not get_skip_data_parallel_grad_sync():
            return all_reduce(grad, DistributedReduceOps.SUM, group, do_async=True).wait(), None
        return original(distparallel_type, group, grad)

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(transforms.backward_impls, PrimIDs.SYNCHRONIZE, backward)
        yield


@contextlib.contextmanager
def _load_state_dict(change: Callable[[Any, dict[str, Any]], dict[str, Any]]) -> Iterator[None]:
    """ThunderModule.load_state_dict loading ``change(module, state_dict)`` instead, leniently."""
    from thunder.core.module import ThunderModule

    original = ThunderModule.load_state_dict

    def load_state_dict(self: Any, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return original(self, change(self, dict(state_dict)), strict=False, assign=assign)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "load_state_dict", load_state_dict)
        yield


@contextlib.contextmanager
def load_drops_buffers() -> Iterator[None]:
    """``load_state_dict`` (a sharded checkpoint's load; a DDP module's whole one) loads the
    parameters and silently leaves every buffer as it was: running statistics restart."""
    with _load_state_dict(lambda tm, sd: {k: v for k, v in sd.items() if k not in dict(tm.named_buffers())}):
        yield


@contextlib.contextmanager
def load_loses_last_rank() -> Iterator[None]:
    """``load_state_dict`` on the last rank loads nothing: that rank's shards (its whole copy,
    under DDP) keep the values they had before the checkpoint was loaded."""
    import torch.distributed as dist

    def change(tm: Any, sd: dict[str, Any]) -> dict[str, Any]:
        return {} if dist.get_rank() == dist.get_world_size() - 1 else sd

    with _load_state_dict(change):
        yield


@contextlib.contextmanager
def _dropout_mask(make: Callable[[Any, Any, Callable[[Any, Any], Any]], Any]) -> Iterator[None]:
    """Thunder's dropout mask made by ``make(a, keep, original)`` instead (``original`` the
    helper it replaces: a uniform draw compared with ``keep``)."""
    import thunder.torch as ltorch

    original = ltorch._dropout_helper
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ltorch, "_dropout_helper", lambda a, keep: make(a, keep, original))
        yield


@contextlib.contextmanager
def dropout_mask_frozen() -> Iterator[None]:
    """The dropout mask fixed when the trace is built (a pattern of the right density instead
    of a draw): every step drops the same elements, p of them."""
    import thunder.torch as ltorch
    import torch

    def frozen(a: Any, keep: Any, original: Any) -> Any:
        # the first keep of the elements kept, the rest dropped: the same every call
        i = ltorch.arange(a.numel(), device=a.device, dtype=torch.float32)
        return ltorch.reshape(ltorch.lt(i, keep * a.numel()), a.shape)

    with _dropout_mask(frozen):
        yield


@contextlib.contextmanager
def dropout_drops_half() -> Iterator[None]:
    """The dropout drops half the elements it should (p / 2), while still scaling the kept by
    1 / (1 - p): outputs and gradients agree with eager replaying the mask; only how many it
    drops is wrong."""
    with _dropout_mask(lambda a, keep, original: original(a, 1 - (1 - keep) / 2)):
        yield


BUGS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    f.__name__: f
    for f in (
        duplicate_tied_all_gather,
        gradients_not_averaged,
        wrong_shard,
        stale_forward_gather,
        one_module_not_materialized,
        stale_original_state_dict,
        originals_kept,
        full_model_before_sharding,
        shard_sources_copied,
        intermediates_not_freed,
        backward_hook_not_called,
        load_after_consumer,
        policy_offloads_nothing,
        offload_keeps_source,
        module_init_draws_wider,
        shards_copied_from_rank0,
        small_tensor_constant,
        gradient_off_later_step,
        gradient_off_on_last_rank,
        bfloat16_gradients_scaled,
        shard_copy_kept,
        tensor_leaked_per_step,
        zero3_originals_kept,
        bucketed_gradients_not_averaged,
        gradients_lost_later_step,
        padding_when_divisible,
        offset_off_past_first_rank,
        collective_order_by_rank,
        frozen_parameters_trained,
        no_grad_ignored,
        second_shape_gradients_not_averaged,
        no_sync_never_ends,
        buffers_not_broadcast,
        module_init_draws_per_rank,
        buffer_updates_dropped,
        ddp_gradients_not_averaged,
        load_drops_buffers,
        load_loses_last_rank,
        dropout_mask_frozen,
        dropout_drops_half,
    )
}


def run_cell_with_bug(bug: str, axes: dict[str, Any]) -> dict[str, Any]:
    from conformance.rank.entry import run_cell

    with BUGS[bug]():
        return run_cell(axes)

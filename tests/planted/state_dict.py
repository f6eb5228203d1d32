"""Bugs of the state dicts: original_state_dict() after training, load_original_state_dict(),
and a checkpoint loaded through load_state_dict (FSDP's sharded one, DDP's whole one)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conformance.checks.checkpoint_record import THUNDER_TAKEN_BY
from fixtures.inits import INITS
from tests.planted.cells import (
    ACCUMULATE,
    ALL,
    DDP,
    FSDP,
    NONE,
    PERSISTENT_BUFFER,
    RESUME,
    TRAINED_BUFFER,
    TRANSFORMED_SD,
    Pred,
)
from tests.planted.record import Expect, planted


@planted({"state_dict": Expect(ALL, NONE, "original_state_dict after training [")})
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
def _load_state_dict(change: Callable[[Any, dict[str, Any]], dict[str, Any]]) -> Iterator[None]:
    """ThunderModule.load_state_dict loading ``change(module, state_dict)`` instead, leniently."""
    from thunder.core.module import ThunderModule

    original = ThunderModule.load_state_dict

    def load_state_dict(self: Any, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return original(self, change(self, dict(state_dict)), strict=False, assign=assign)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "load_state_dict", load_state_dict)
        yield


# Loses the buffers: only where a buffer changed since init (running statistics), and a
# materialization from the sharded state dict the kit hands over, where buffers are.
@planted(
    {
        "state_dict": Expect(
            lambda c: RESUME(c) and TRAINED_BUFFER(c), NONE, "checkpoint resumed: buffers after loading"
        ),
        "materialization": Expect(NONE, lambda c: TRANSFORMED_SD(c) and TRAINED_BUFFER(c)),
        "numerics": Expect(NONE, lambda c: TRANSFORMED_SD(c) and TRAINED_BUFFER(c)),
    },
    cells=(
        lambda c: RESUME(c) and TRAINED_BUFFER(c) and not DDP(c),
        lambda c: RESUME(c) and DDP(c),
        lambda c: RESUME(c) and not TRAINED_BUFFER(c),
    ),
)
@contextlib.contextmanager
def load_drops_buffers() -> Iterator[None]:
    """``load_state_dict`` (a sharded checkpoint's load; a DDP module's whole one) loads the
    parameters and silently leaves every buffer as it was: running statistics restart."""
    with _load_state_dict(lambda tm, sd: {k: v for k, v in sd.items() if k not in dict(tm.named_buffers())}):
        yield


# Loses the last rank's shards: every resumed cell, on that rank; and every cell
# materialized from a sharded state dict starts from what that rank's shards held before.
@planted(
    {
        "state_dict": Expect(RESUME, TRANSFORMED_SD, "checkpoint resumed: weights after loading"),
        "materialization": Expect(TRANSFORMED_SD, NONE, "initial parameters ["),
        "numerics": Expect(NONE, TRANSFORMED_SD),
        "collectives": Expect(NONE, TRANSFORMED_SD),
        "memory": Expect(NONE, TRANSFORMED_SD),
    },
    cells=(
        lambda c: RESUME(c) and not DDP(c),
        lambda c: RESUME(c) and DDP(c),
        TRANSFORMED_SD,
        # fsdp(jit(m)) materializes through module init and loads the state dict after it:
        # a load that writes nothing shows only because module init draws other values
        lambda c: TRANSFORMED_SD(c) and c.composition == "fsdp_jit",
        lambda c: ACCUMULATE(c) and not TRANSFORMED_SD(c),
    ),
)
@contextlib.contextmanager
def load_loses_last_rank() -> Iterator[None]:
    """``load_state_dict`` on the last rank loads nothing: that rank's shards (its whole copy,
    under DDP) keep the values they had before the checkpoint was loaded."""
    import torch.distributed as dist

    def change(tm: Any, sd: dict[str, Any]) -> dict[str, Any]:
        return {} if dist.get_rank() == dist.get_world_size() - 1 else sd

    with _load_state_dict(change):
        yield


# Every cell whose model has persistent buffers: the round trip loads known values into them.
# An init that materializes through load_original_state_dict (the original state dict handed
# over, or loaded after module init) starts that rank from an unloaded buffer too.
_LOADS_ORIGINAL = lambda c: PERSISTENT_BUFFER(c) and (  # noqa: E731
    INITS[c.init].state_dict == "original" or INITS[c.init].load_after
)


@planted(
    {
        "state_dict": Expect(PERSISTENT_BUFFER, NONE, "load_original_state_dict round trip: buffers ["),
        "materialization": Expect(NONE, _LOADS_ORIGINAL),
        "numerics": Expect(NONE, _LOADS_ORIGINAL),
    },
    cells=(
        lambda c: PERSISTENT_BUFFER(c) and not DDP(c),
        lambda c: PERSISTENT_BUFFER(c) and DDP(c),
        lambda c: not PERSISTENT_BUFFER(c),
    ),
)
@contextlib.contextmanager
def load_original_skips_a_buffer_on_last_rank() -> Iterator[None]:
    """``load_original_state_dict`` on the last rank loads the parameters and every buffer but
    the first persistent one it is handed, which keeps the value it had: one buffer, one rank."""
    import torch.distributed as dist
    from thunder.core.module import ThunderModule

    original = ThunderModule.load_original_state_dict

    def load_original_state_dict(self: Any, state_dict: dict[str, Any]) -> Any:
        if dist.get_rank() == dist.get_world_size() - 1:
            buffers = dict(self.named_buffers())
            first = next((k for k in state_dict if k in buffers), None)
            state_dict = {k: v for k, v in state_dict.items() if k != first}
        return original(self, state_dict)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "load_original_state_dict", load_original_state_dict)
        yield


# Only the resume scenario reloads an optimizer; the moments come back whole, so only the
# checkpoint's comparison of the optimizer state (and every resumed step after) can see it.
@planted(
    {"state_dict": Expect(RESUME, NONE, "checkpoint resumed: optimizer state after loading [")},
    cells=(lambda c: RESUME(c) and not DDP(c), lambda c: RESUME(c) and DDP(c), lambda c: not RESUME(c)),
)
@contextlib.contextmanager
def optimizer_reload_loses_a_step() -> Iterator[None]:
    """An optimizer reloaded from its state dict restores every moment but counts one step
    fewer (AdamW's bias correction of the next step then differs)."""
    import torch

    original = torch.optim.Optimizer.load_state_dict

    def load_state_dict(self: Any, state_dict: dict[str, Any]) -> None:
        original(self, state_dict)
        for state in self.state.values():
            if "step" in state:
                state["step"] = state["step"] - 1

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.Optimizer, "load_state_dict", load_state_dict)
        yield


# Only the resume scenario asks for rank0_only. The take shows on DDP cells alone: an FSDP
# module's get_model_state_dict raises on CPU ranks (the pin's xfail), before rank0_only counts.
@planted(
    {"state_dict": Expect(RESUME, NONE, "full checkpoint with rank0_only")},
    cells=(lambda c: RESUME(c) and not DDP(c), lambda c: RESUME(c) and DDP(c)),
)
@contextlib.contextmanager
def rank0_only_half_honoured() -> Iterator[None]:
    """``StateDictOptions(rank0_only=True)`` half honoured: taking the full checkpoint, every
    rank gets all of it; loading it, rank 0 loads every entry but the last it is handed (one
    tensor keeps the fresh module's value)."""
    import dataclasses

    from thunder.distributed import checkpoint

    take, load = checkpoint.get_model_state_dict, checkpoint.load_model_state_dict

    def get_model_state_dict(module: Any, options: Any, rank: int) -> dict[str, Any]:
        return take(module, dataclasses.replace(options, rank0_only=False), rank)

    def load_model_state_dict(state_dict: dict[str, Any], module: Any, options: Any, rank: int) -> None:
        if options.rank0_only and state_dict:
            state_dict = dict(list(state_dict.items())[:-1])
        load(state_dict, module, options, rank)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "get_model_state_dict", get_model_state_dict)
        mp.setattr(checkpoint, "load_model_state_dict", load_model_state_dict)
        yield


# The pin's raise on a gloo world (get_model_state_dict's CUDA mesh) is torch's code's; a raise
# of Thunder's own before it is another finding (the census's survivors at checkpoint.py:92 and
# :104 before the kit pinned whose code raised, each a condition turned around).
SAME_SIZE_FSDP_RESUME: Pred = lambda cell: RESUME(cell) and FSDP(cell) and cell.saved_at is None  # noqa: E731


@planted(
    {"state_dict": Expect(SAME_SIZE_FSDP_RESUME, NONE, f"with rank0_only: {THUNDER_TAKEN_BY} raised ValueError")},
    cells=(SAME_SIZE_FSDP_RESUME, lambda c: RESUME(c) and DDP(c)),
)
@contextlib.contextmanager
def rank0_only_refused_on_sharded_modules() -> Iterator[None]:
    """``get_model_state_dict`` refuses ``rank0_only`` for an FSDP module (the ValueError it
    keeps for a sharded checkpoint asked of rank 0 alone), before it builds its mesh."""
    from thunder.distributed import checkpoint

    take = checkpoint.get_model_state_dict

    def get_model_state_dict(module: Any, options: Any, rank: int) -> dict[str, Any]:
        if options.rank0_only and checkpoint.has_fsdp_modules(module):
            raise ValueError("`rank0_only=True` cannot be used with `full_state_dict=False`")
        return take(module, options, rank)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "get_model_state_dict", get_model_state_dict)
        yield


@planted(
    {"state_dict": Expect(lambda c: RESUME(c) and FSDP(c), NONE, f"{THUNDER_TAKEN_BY} raised RuntimeError")},
    cells=(lambda c: RESUME(c) and FSDP(c), lambda c: RESUME(c) and DDP(c)),
)
@contextlib.contextmanager
def fsdp_modules_taken_for_unsharded() -> Iterator[None]:
    """``get_model_state_dict`` takes an FSDP module for one FSDP never transformed and raises
    its own RuntimeError, a RuntimeError as the pin's on CPUs is, but raised by Thunder's code."""
    from thunder.distributed import checkpoint

    take = checkpoint.get_model_state_dict

    def get_model_state_dict(module: Any, options: Any, rank: int) -> dict[str, Any]:
        if checkpoint.has_fsdp_modules(module):
            raise RuntimeError(f"Expected {type(module).__name__} to be FSDP transformed")
        return take(module, options, rank)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "get_model_state_dict", get_model_state_dict)
        yield

"""Eager PyTorch computing as FSDP2's ``MixedPrecisionPolicy`` makes a model compute
(fixtures/options.py: MIXED), on one process: the parameters kept in their dtype (float32, what
the optimizer steps), each forward on copies cast to the compute dtype (one per distinct
storage: a tie's names share it), buffers as they are, and the floating arguments of every
FSDP2 unit's forward cast as FSDP2 casts them (``cast_forward_inputs``: litgpt's blocks get
bfloat16 RoPE tables). Autograd carries each cast back, so a parameter's gradient is the
compute dtype's gradient of its copy cast up: FSDP2's unsharded gradient, cast to
``reduce_dtype`` before its reduce-scatter (tests/unit/test_mixed_precision.py: bit for bit).

The classes of the model and its units are swapped for subclasses whose forwards do this, so
that every copy the references make (``copy.deepcopy``) computes alike; the float32 twin takes
them back."""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def mixed(module: nn.Module, compute: torch.dtype, wrap: str) -> nn.Module:
    """``module`` (in place) computing its forward and backward in ``compute``, as FSDP2 with
    the units ``wrap`` makes (``fixtures.torch_parallel.units``) computes it: the inner units'
    inputs cast too."""
    from fixtures.torch_parallel import units

    for unit in units(module, wrap)[:-1]:
        unit.__class__ = _casting(type(unit), compute)
    module.__class__ = _computing(type(module), compute)
    return module


def computed_in(module: nn.Module) -> torch.dtype | None:
    """The dtype ``mixed`` made ``module`` compute in (None: its parameters')."""
    return getattr(type(module), "_kit_compute", None)


@contextlib.contextmanager
def casts_made(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """The casts of the parameters ``module``'s forwards make in the block (none where it is
    not ``mixed``): the tensors FSDP2 would gather and register for the forward."""
    casts: list[torch.Tensor] = []
    module.__dict__["_kit_casts"] = casts
    try:
        yield casts
    finally:
        module.__dict__.pop("_kit_casts", None)


def unmixed(module: nn.Module) -> nn.Module:
    """``module`` (in place) computing in its parameters' dtype again."""
    for m in module.modules():
        m.__class__ = getattr(type(m), "_kit_uncast", type(m))
    return module


def float32_twin(module: nn.Module, compute: torch.dtype) -> nn.Module | None:
    """A float32 copy of the eager ``module`` computing in float32, where the cell computes
    below it (``compute``: its tolerances' reference); None where it computes in float32."""
    if compute == torch.float32:
        return None
    return unmixed(copy.deepcopy(module)).float()  # .float() is in place


def _cast(args: tuple[Any, ...], kwargs: dict[str, Any], compute: torch.dtype) -> tuple[tuple, dict]:
    def cast(a: Any) -> Any:
        return a.to(compute) if isinstance(a, torch.Tensor) and a.is_floating_point() else a

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


@functools.cache
def _casting(base: type[nn.Module], compute: torch.dtype) -> type[nn.Module]:
    """``base`` whose forward casts its floating arguments to ``compute`` (an inner unit's)."""

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _cast(args, kwargs, compute)
        return base.forward(self, *args, **kwargs)

    return type(f"Casting{base.__name__}", (base,), {"forward": forward, "_kit_uncast": base})


@functools.cache
def _computing(base: type[nn.Module], compute: torch.dtype) -> type[nn.Module]:
    """``base`` whose forward also runs on its parameters cast to ``compute`` (the root's)."""
    from torch.nn.utils.stateless import _reparametrize_module

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        cast = {name: p.to(compute) for name, p in nn.Module.named_parameters(self)}
        if "_kit_casts" in self.__dict__:  # casts_made is reading them
            self.__dict__["_kit_casts"].extend(cast.values())
        args, kwargs = _cast(args, kwargs, compute)
        with _reparametrize_module(self, cast, tie_weights=True):
            return base.forward(self, *args, **kwargs)

    attributes = {"forward": forward, "_kit_uncast": base, "_kit_compute": compute}
    return type(f"Computing{base.__name__}", (base,), attributes)

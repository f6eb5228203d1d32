"""What eager PyTorch allocates initializing each module of a meta-built model on its own,
the way Thunder's MaterializationTransform does it under meta init: a shallow copy of the
module that owns its direct tensors only, ``to_empty(recurse=False)`` on the device, then
``reset_parameters()``. The memory area builds the setup bound of meta cells from these
readings (``conformance/checks/memory/setup_path.py``); they are eager's, never Thunder's."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection

import torch
from torch import nn

from conformance.checks.memory.setup_path import materialized
from conformance.checks.record import ModuleInit
from conformance.rank import measure


def module_inits(
    make: Callable[[], nn.Module],
    dtype: torch.dtype,
    device: torch.device,
    non_persistent_only: bool,
    only: Collection[str] | None = None,
) -> list[ModuleInit]:
    """One reading per module Thunder initializes this way, in ``named_modules`` order (the
    order it materializes in): each module that owns a tensor, or where it loads a state dict
    (``non_persistent_only``) each that owns a non-persistent buffer; ``only``: of these modules
    alone (a partly-meta model's fresh part). The global RNG is left as it was: a reset draws."""
    with torch.device("meta"):
        model = make().to(dtype)  # as fixtures.inits.build builds a meta cell's model
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return [
            _init(name, m, device)
            for name, m in model.named_modules()
            if materialized(m, non_persistent_only) and (only is None or name in only)
        ]


def _init(name: str, module: nn.Module, device: torch.device) -> ModuleInit:
    if not hasattr(module, "reset_parameters"):  # Thunder refuses such a module (a negative cell)
        return ModuleInit(name, peak=None, kept=None)
    shallow = copy.copy(module)
    shallow._parameters = shallow._parameters.copy()
    shallow._buffers = shallow._buffers.copy()
    shallow._modules = shallow._modules.__class__()
    with measure.measure(device) as reading:
        shallow.to_empty(device=device, recurse=False)
        shallow.reset_parameters()
    # a buffer the reset gives another dtype or shape: Thunder converts it back to the
    # model's when it loads the module (ThunderModule._transform_and_load_for_submodule)
    model = dict(module.named_buffers(recurse=False))
    replaced = {
        n: b.untyped_storage().nbytes()
        for n, b in shallow.named_buffers(recurse=False)
        if n in model and (b.dtype != model[n].dtype or b.shape != model[n].shape)
    }
    return ModuleInit(name, peak=reading.peak, kept=reading.alive, replaced=replaced)

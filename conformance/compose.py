"""Compositions: the ways a user can put Thunder's jit and its FSDP transform together.

Each takes the module under test and returns the ThunderModule the cell drives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def fsdp_jit(module: torch.nn.Module, device: torch.device, materialization: Any, options: dict[str, Any]) -> Any:
    """``fsdp(jit(m))``: trace first, then shard the ThunderModule (materialization built in)."""
    import thunder
    import thunder.distributed

    return thunder.distributed.fsdp(thunder.jit(module), device=device, **options)


def jit_fsdp(module: torch.nn.Module, device: torch.device, materialization: Any, options: dict[str, Any]) -> Any:
    """The modern "jit(fsdp)": the sharding transform handed to ``thunder.jit`` itself.

    Mirrors what ``thunder.distributed.fsdp`` sets up, so that the two cells differ only in
    the order in which tracing and sharding meet.
    """
    import thunder
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform
    from thunder.transforms import MaterializationTransform

    return thunder.jit(
        module,
        transforms=[
            FSDPTransform(device=device, release_original_parameters=True, **options),
            MaterializationTransform(device, init=materialization),
        ],
    )


COMPOSITIONS: dict[str, Callable[..., Any]] = {"fsdp_jit": fsdp_jit, "jit_fsdp": jit_fsdp}

"""Compositions: the ways a user can put Thunder's jit and its FSDP transform together.

Each builds the ThunderModule that a cell drives. A composition that the Thunder under test
may no longer support carries a probe, run on the ranks, that says why.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch


def fsdp_jit(
    module: torch.nn.Module, device: torch.device, materialization: Any, options: dict[str, Any], transforms: list[Any]
) -> Any:
    """``fsdp(jit(m))``: trace first, then shard the ThunderModule (module-init
    materialization built in)."""
    import thunder
    import thunder.distributed

    return thunder.distributed.fsdp(thunder.jit(module, transforms=transforms), device=device, **options)


def jit_fsdp(
    module: torch.nn.Module, device: torch.device, materialization: Any, options: dict[str, Any], transforms: list[Any]
) -> Any:
    """The modern "jit(fsdp)": the sharding transform handed to ``thunder.jit`` itself,
    set up as ``thunder.distributed.fsdp`` sets it up, with the cell's materialization."""
    import thunder
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform
    from thunder.transforms import MaterializationTransform

    return thunder.jit(
        module,
        transforms=[
            FSDPTransform(device=device, release_original_parameters=True, **options),
            MaterializationTransform(device, init=materialization),
            *transforms,
        ],
    )


def legacy_jit_fsdp(
    module: torch.nn.Module, device: torch.device, materialization: Any, options: dict[str, Any], transforms: list[Any]
) -> Any:
    """``jit(fsdp(m))`` on a plain module: shard (and materialize) eagerly, then trace.
    Removed in Thunder 0.2.1 (PR #1640)."""
    import thunder
    import thunder.distributed

    return thunder.jit(thunder.distributed.fsdp(module, device=device, **options), transforms=transforms)


@functools.cache
def _legacy_unsupported(device: torch.device) -> str | None:
    import thunder.distributed

    try:
        thunder.distributed.fsdp(torch.nn.Linear(2, 2, device=device), device=device)
    except TypeError as exc:
        return f"thunder.distributed.fsdp(nn.Module) raises TypeError: {exc}"
    return None


@dataclasses.dataclass(frozen=True)
class Composition:
    name: str
    build: Callable[..., Any]
    # whether the cell's MaterializationTransform init can be handed in; otherwise the
    # composition materializes through module init and state dicts are loaded afterwards
    takes_materialization_init: bool
    # None where supported, else the reason; runs on a rank, once per process
    probe: Callable[[torch.device], str | None] | None = None
    # init modes the composition can express at all
    inits: tuple[str, ...] | None = None


COMPOSITIONS: dict[str, Composition] = {
    c.name: c
    for c in (
        Composition("fsdp_jit", fsdp_jit, takes_materialization_init=False),
        Composition("jit_fsdp", jit_fsdp, takes_materialization_init=True),
        Composition(
            "legacy_jit_fsdp",
            legacy_jit_fsdp,
            takes_materialization_init=False,
            probe=_legacy_unsupported,
            inits=("real", "real_broadcast", "meta_module_init"),
        ),
    )
}

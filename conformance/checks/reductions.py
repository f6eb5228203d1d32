"""What each backward hands its gradient reductions (FSDP's reduce-scatters, DDP's
all-reduces), by bytes and dtype, against what the model implies; read through bound symbols
(``traces.issued``), never the printed trace.

Derivation. A synced backward reduces the gradient of every trainable parameter storage once
(a tied weight is one storage), in that parameter's dtype: a gradient has its parameter's
dtype, and the reduction is what averages it. Under FSDP each gradient is reduce-scattered
with dim 0 padded up to a multiple of the world size (the forward's all-gather produced the
padded tensor; the reduce-scatter cuts its gradient back into the shards), so the bytes
reduce-scattered are ``storages.padded_bytes`` of the trainable storages; under DDP each is
all-reduced whole. Buckets (FSDP's, or DDP's ``buckets.ddp_buckets``) pack these same
gradients into flat buffers, one per bucket and dtype: the total is the same with or without
bucketing, so no alternative needs naming here, and the counts stay the collectives area's
say. Any collective whose input dtype is not its gradients' dtype is a finding naming it: a
reduction upcast to float32 for bfloat16 gradients moves twice the bytes and is numerically
invisible (it is more accurate, not less).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.checks.findings import Findings
from conformance.checks.storages import distinct_storages, padded_bytes
from conformance.checks.traces import collective_symbols
from transforms.policies import proxy_bytes

# the reduction each kind of composition's backward issues, and how its bytes are named
REDUCING = {False: ("reduce_scatter", "reduce-scattered"), True: ("all_reduce", "all-reduced")}


def expected_reduced_bytes(module: torch.nn.Module, world_size: int, replicated: bool) -> int:
    """Bytes one synced backward hands its reductions: every trainable storage's gradient,
    dim 0 padded to the world size where it is sharded, whole where it is replicated."""
    storages = distinct_storages(module, trainable_only=True).values()
    return sum(p.numel() * p.element_size() if replicated else padded_bytes(p, world_size) for p in storages)


def gradient_dtypes(module: torch.nn.Module) -> set[str]:
    """The dtypes of the trainable parameters, so of their gradients, by name (``bfloat16``)."""
    return {_torch_name(p.dtype) for p in distinct_storages(module, trainable_only=True).values()}


def judge_backward(
    found: Findings, label: str, trace: Any, module: torch.nn.Module, world_size: int, replicated: bool, *, bytes_: bool
) -> None:
    """The reductions of one backward ``trace``: each one's input dtype against the
    gradients' and, where ``bytes_`` (a backward that must reduce), their total input bytes
    against ``expected_reduced_bytes``."""
    kind, verb = REDUCING[replicated]
    reductions = collective_symbols(trace)[kind]
    wanted = gradient_dtypes(module)
    expected_dtype = " or ".join(sorted(wanted))
    wrong = []
    for i, bsym in enumerate(reductions):
        tensor = _input(bsym)
        got = _proxy_dtype(tensor)
        if got not in wanted:
            name = getattr(tensor, "name", "no input")
            size = f", {_bytes_of(tensor)} B" if got is not None else ""
            wrong.append(f"{kind} {i + 1} of {len(reductions)} ({name}{size}) in {got or 'no dtype'}")
    found.metrics[f"{label} {kind} dtypes"] = sorted({_proxy_dtype(_input(b)) or "none" for b in reductions})
    with found.expect("collectives.reduction_dtype", f"{label} {kind} dtypes", phase=label, kind=kind, wrong=wrong):
        assert not wrong, f"expected the gradients' dtype {expected_dtype}, got {'; '.join(wrong)}"
    if bytes_:
        got_bytes = sum(_bytes_of(_input(b)) for b in reductions)
        expected = expected_reduced_bytes(module, world_size, replicated)
        found.equal(
            "collectives.bytes",
            f"{label} {verb} bytes",
            got_bytes,
            expected,
            bytes_derived(expected, world_size),
            phase=label,
            kind=kind,
        )


def bytes_derived(expected: int, world_size: int) -> dict[str, float]:
    """What an xfails range over a collective's bytes may reach: every storage moved once per rank."""
    return {"expected_times_world_size": expected * world_size}


def _input(bsym: Any) -> Any:
    """The tensor a collective reduces: its first proxy argument (None where it has none)."""
    return bsym.flat_proxy_args[0] if bsym.flat_proxy_args else None


def _proxy_dtype(tensor: Any) -> str | None:
    """A proxy's dtype by name (``bfloat16``), None where it has none (a collective whose input
    is no tensor: a finding, never a crash)."""
    dtype = getattr(tensor, "dtype", None)
    if dtype is None:
        return None
    return str(dtype).removeprefix("thunder.dtypes.").rstrip("_")  # a weak dtype prints with "_"


def _bytes_of(tensor: Any) -> int:
    """Bytes the proxy declares (0 where it declares no shape or dtype: the total falls short,
    a finding)."""
    try:
        return proxy_bytes(tensor)
    except (AttributeError, TypeError):
        return 0


def _torch_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

"""Eager PyTorch as the kit runs it beside the Thunder module: the loss every rank's
micro-batch is weighed by, a copy of the eager model holding given weights, and eager's
gradients of the ranks' averaged loss, returned rather than accumulated."""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from conformance.checks.record import LossRegion, RankGradients
from conformance.rank.buffers import PerRank
from conformance.rank.gather import cpu_copies
from conformance.rank.measure import measure

Tensors = dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class EagerPass:
    """What ``eager_gradients`` computed, read by name (the references of a training step,
    the scenarios)."""

    outputs: list[torch.Tensor]  # every rank's output, CPU copies, in rank order
    grads: Tensors  # gradients of the ranks' averaged loss, by parameter name (one per tie)


def float32_input(x: torch.Tensor) -> torch.Tensor:
    """An input as the float32 twin takes it (token ids stay integers)."""
    return x.float() if x.is_floating_point() else x


def loss(out: torch.Tensor, cotangent: torch.Tensor) -> torch.Tensor:
    """One rank's loss: its output weighted by a random cotangent."""
    return (out * cotangent).mean()


def loss_region(out: torch.Tensor, cotangent: torch.Tensor, device: torch.device) -> LossRegion:
    """What the backward phase allocates around Thunder's backward: the kit's loss and
    autograd's way back to the output, measured eagerly on a leaf like the output. Its
    peak, and what is alive when the output's gradient is handed over (the gradient, the
    loss, autograd's seed): Thunder's backward begins from that."""
    leaf = torch.zeros(out.shape, dtype=out.dtype, device=device, requires_grad=True)
    with measure(device) as region:
        leaf.register_hook(lambda grad: region.mark())
        loss(leaf, cotangent).backward()
    return LossRegion(region.peak, region.marks[0] if region.marks else 0)


def eager_peaks(
    eager_model: nn.Module, x: torch.Tensor, cotangent: torch.Tensor, device: torch.device
) -> dict[str, int]:
    """Eager's peaks for this rank's input, and what its forward left alive (the output and
    what autograd saved); gradients are returned, not accumulated, so the eager model's own
    training is untouched."""
    with measure(device) as forward:
        out = eager_model(x)
    rank_loss = loss(out, cotangent)
    with measure(device) as backward:
        torch.autograd.grad(rank_loss, [p for p in eager_model.parameters() if p.requires_grad])
    return {"forward": forward.peak, "backward": backward.peak, "alive after forward": forward.alive}


def unweighable(out: object, expected: torch.Tensor) -> str | None:
    """Why the Thunder module's output cannot be weighed by the loss eager's output is, if it
    cannot: not a tensor, another shape, dtype or device than eager's output, or one no op
    can read."""
    if not isinstance(out, torch.Tensor):
        return f"is a {type(out).__name__}, eager's a tensor of shape {tuple(expected.shape)}"
    for what, got, want in (
        ("shape", tuple(out.shape), tuple(expected.shape)),
        ("dtype", out.dtype, expected.dtype),
        ("device", out.device, expected.device),
    ):
        if got != want:
            return f"has {what} {got}, eager's {want}"
    try:  # the loss and the kit's copy read its values
        out.detach()
    except Exception as exc:
        return f"cannot be read: {type(exc).__name__}: {exc}"
    return None


def mean_loss(outputs: list[torch.Tensor], cotangents: list[torch.Tensor]) -> torch.Tensor:
    """FSDP averages gradients over ranks: eager's loss is the mean of the ranks' losses."""
    return sum(loss(o, c) for o, c in zip(outputs, cotangents, strict=True)) / len(outputs)


def holding(module: nn.Module, weights: Tensors) -> nn.Module:
    """A copy of the eager ``module`` whose parameters hold ``weights`` (one name per tied
    group: writing it writes every name of the tie)."""
    twin = copy.deepcopy(module)
    with torch.no_grad():
        for name, value in weights.items():
            p = twin.get_parameter(name)
            p.copy_(value.to(p.device, p.dtype))
    return twin


def eager_gradients(
    module: nn.Module,
    inputs: list[torch.Tensor],
    cotangents: list[torch.Tensor],
    buffers: PerRank | None = None,
    float32: bool = False,
) -> EagerPass:
    """``module``'s outputs on every rank's input (CPU copies) and its gradients of the ranks'
    averaged loss, by parameter name (one per tie), frozen parameters left out as eager leaves
    them None. ``buffers``: each rank's forward runs with that rank's buffers (what it makes
    of them is kept: pass clones where it must not be). ``float32``: inputs and cotangents as
    the float32 twin takes them."""
    if float32:
        inputs, cotangents = [float32_input(x) for x in inputs], [c.float() for c in cotangents]
    outs = [module(x) for x in inputs] if buffers is None else buffers.forward(inputs)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(mean_loss(outs, cotangents), [p for _, p in named], allow_unused=True)
    pairs = ((n, g) for (n, _), g in zip(named, grads, strict=True) if g is not None)
    return EagerPass([o.detach().cpu() for o in outs], cpu_copies(pairs))


def rank_gradients(
    module: nn.Module, inputs: list[torch.Tensor], cotangents: list[torch.Tensor], buffers: PerRank | None = None
) -> RankGradients:
    """Each rank's gradient of its own loss alone, computed by ``module`` in its dtype (as a
    data-parallel rank computes it before any reduction): their mean over the ranks and the
    mean of their magnitudes, in float64. Against the Thunder module's reduced gradient at the
    same weights, what differs is the reduction's rounding and the local computation's, never
    a scale (conformance/checks/numerics/scale.judge_gradient_scale)."""
    outs = [module(x) for x in inputs] if buffers is None else buffers.forward(inputs)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    total: dict[str, torch.Tensor] = {}
    magnitude: dict[str, torch.Tensor] = {}
    for r, (out, cotangent) in enumerate(zip(outs, cotangents, strict=True)):
        last = r == len(outs) - 1
        grads = torch.autograd.grad(
            loss(out, cotangent), [p for _, p in named], allow_unused=True, retain_graph=not last
        )
        for (n, _), g in zip(named, grads, strict=True):
            if g is not None:
                g = g.detach().to("cpu", torch.float64)
                total[n] = total[n] + g if n in total else g
                magnitude[n] = magnitude[n] + g.abs() if n in magnitude else g.abs()
    w = len(outs)
    return RankGradients({n: t / w for n, t in total.items()}, {n: t / w for n, t in magnitude.items()})


def float64_gradients(
    module: nn.Module, inputs: list[torch.Tensor], cotangents: list[torch.Tensor], buffers: PerRank
) -> EagerPass:
    """``module``'s outputs and gradients of the ranks' averaged loss computed in float64 (a
    copy), each rank's micro-batch with that rank's ``buffers`` (cast): for a float32 module,
    the reference its own float32 roundings are measured against."""
    exact = copy.deepcopy(module).double()
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    return eager_gradients(exact, inputs, [c.double() for c in cotangents], buffers.cast_for(exact, torch.float64))

"""What a model has that a distributed transform may mishandle (its *features*), read off the
built module, never listed by hand: a model name stands for a bundle of them, and a
regression nearly always needs one of them, the transform family that mishandles it and what
is done with the module (conformance/matrix/contract.py).

Structure is read on the meta device (no values drawn); what only values show (a buffer a
training forward moves, a buffer drawn at random) from two small builds on the CPU, seeded
apart, and one training forward of the model's own input. Cached per model, tie and world
size: the fixtures are deterministic.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

# Every feature, in the order reports list them. Each names one thing a check depends on:
# - trained_buffer: a buffer a training forward changes (BatchNorm's running statistics)
# - random_buffer: a persistent buffer drawn at random at init (two seeds draw it apart)
# - persistent_buffer: a state dict entry that is no parameter (a rotary cache is not one)
# - tie: one parameter reachable under two names
# - frozen: a parameter with requires_grad=False
# - root_owned: a parameter or persistent buffer registered on the root (no dot in its name)
# - ragged: a parameter whose first dimension the world size does not divide (padding)
# - dropout: a dropout module of nonzero probability
# - litgpt: a litgpt module (its rotary caches, its blocks)
FEATURES = (
    "trained_buffer",
    "random_buffer",
    "persistent_buffer",
    "tie",
    "frozen",
    "root_owned",
    "ragged",
    "dropout",
    "litgpt",
)


@functools.cache
def features(model: str, tie: str, world_size: int, spec: str | None = None) -> frozenset[str]:
    """The features of the cell's model (a registered one, or one a spec generates) at
    ``world_size``."""
    ragged = _first_dims(model, tie, spec)
    out = set(_structural(model, tie, spec)) | set(_valued(model, tie, spec))
    if world_size > 1 and any(d % world_size for d in ragged):
        out.add("ragged")
    return frozenset(out)


def _build(model: str, tie: str, spec: str | None, device: str) -> nn.Module:
    from fixtures.models import fixture_for

    with torch.device(device):
        return fixture_for(model, spec).build(tie == "tied")


@functools.cache
def _first_dims(model: str, tie: str, spec: str | None) -> tuple[int, ...]:
    module = _build(model, tie, spec, "meta")
    return tuple(p.shape[0] for p in module.parameters() if p.dim() > 0)


@functools.cache
def _structural(model: str, tie: str, spec: str | None) -> frozenset[str]:
    """What the module's structure says, built on the meta device."""
    module = _build(model, tie, spec, "meta")
    out = set()
    named = list(module.named_parameters(remove_duplicate=False))
    if len({id(p) for _, p in named}) < len(named):
        out.add("tie")
    if any(not p.requires_grad for _, p in named):
        out.add("frozen")
    parameters = {n for n, _ in named}
    state = set(module.state_dict())
    if state - parameters:
        out.add("persistent_buffer")
    if any("." not in n for n in state):
        out.add("root_owned")
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules()):
        out.add("dropout")
    if type(module).__module__.split(".")[0] == "litgpt":
        out.add("litgpt")
    return frozenset(out)


@functools.cache
def _valued(model: str, tie: str, spec: str | None) -> frozenset[str]:
    """What only values show: two CPU builds seeded apart (a persistent buffer they draw
    apart is random) and one training forward of the first on the model's own input (a
    buffer it changes is trained). Only for a module with persistent buffers."""
    from fixtures.models import fixture_for

    meta = _build(model, tie, spec, "meta")
    persistent = set(meta.state_dict()) - {n for n, _ in meta.named_parameters(remove_duplicate=False)}
    # a non-persistent buffer (a rotary cache) is a function of the configuration, never in a
    # checkpoint: only persistent ones are worth two real builds (a wide model has none)
    if not persistent:
        return frozenset()
    builds = []
    with torch.random.fork_rng(devices=[]):  # the caller's random state stays its own
        for seed in (0, 1):
            torch.manual_seed(seed)
            builds.append(_build(model, tie, spec, "cpu"))
    out = set()
    first, second = (dict(b.named_buffers()) for b in builds)
    if any(not torch.equal(first[n], second[n]) for n in persistent):
        out.add("random_buffer")
    module = builds[0].train()
    before = {n: b.clone() for n, b in module.named_buffers()}
    with torch.no_grad():  # a training forward moves running statistics without a gradient
        module(fixture_for(model, spec).make_input(torch.Generator().manual_seed(0), torch.float32))
    if any(not torch.equal(b, before[n]) for n, b in module.named_buffers()):
        out.add("trained_buffer")
    return frozenset(out)

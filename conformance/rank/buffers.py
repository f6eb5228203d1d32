"""Buffers the forward updates (running statistics), kept per rank for an eager model that
runs every rank's micro-batch.

Under data parallelism each rank updates such a buffer from its own micro-batch alone (the
Thunder module on rank r holds what r's batches made of it), while the kit's eager models
run every rank's micro-batch in turn. So an eager model keeps one set of buffers per rank:
rank r's forward runs with set r loaded and saves what it made of it back; between steps the
model holds this rank's set, the one its Thunder module must equal. A model whose forward
updates nothing has every set equal, and nothing changes.

The other per-rank state of an eager model is which rank's dropout mask a replayed dropout
applies (conformance/rank/dropout.py): running rank r's micro-batch points it at r's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from conformance.rank.dropout import point_at


class PerRank:
    """The sets are bound to the module as its buffers, never copied into them: a copy would
    bump the version of a buffer an earlier rank's forward saved for backward (a fixed
    projection, say), and autograd would refuse that backward."""

    def __init__(self, module: nn.Module, world: int) -> None:
        self.module = module
        self.sets = [self._cloned(self._bound()) for _ in range(world)]

    def _bound(self) -> dict[str, torch.Tensor]:
        return dict(self.module.named_buffers())

    @staticmethod
    def _cloned(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {n: t.detach().clone() for n, t in values.items()}

    def _bind(self, values: dict[str, torch.Tensor]) -> None:
        for name, t in values.items():
            owner, _, leaf = name.rpartition(".")
            self.module.get_submodule(owner)._buffers[leaf] = t

    @contextlib.contextmanager
    def rank(self, r: int, keep: bool = True) -> Iterator[None]:
        """Run with rank ``r``'s buffers; ``keep``: what the run made of them becomes r's
        (False: a forward beside the training, e.g. one measured for eager's peak, leaves no
        trace)."""
        self._bind(self.sets[r] if keep else self._cloned(self.sets[r]))
        point_at(self.module, r)
        try:
            yield
        finally:
            if keep:
                self.sets[r] = self._bound()  # updated in place, or rebound by the forward
            self._bind(self.sets[r])

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The module on every rank's input, each with that rank's buffers (kept)."""
        outs = []
        for r, x in enumerate(inputs):
            with self.rank(r):
                outs.append(self.module(x))
        return outs

    def hold(self, r: int) -> None:
        """Leave the model holding rank ``r``'s buffers."""
        self._bind(self.sets[r])

    def clones_for(self, module: nn.Module) -> PerRank:
        """Copies of every rank's set, bound to ``module`` (a copy of this one's, of the same
        structure): runs on it leave these sets untouched."""
        return self._bound_to(module, [self._cloned(s) for s in self.sets])

    def cast_for(self, module: nn.Module, dtype: torch.dtype) -> PerRank:
        """Every rank's set, floating buffers cast to ``dtype``, bound to ``module`` (a copy
        of this one's in ``dtype``)."""
        sets = [{n: t.to(dtype) if t.is_floating_point() else t for n, t in s.items()} for s in self.sets]
        return self._bound_to(module, sets)

    @staticmethod
    def _bound_to(module: nn.Module, sets: list[dict[str, torch.Tensor]]) -> PerRank:
        other = PerRank.__new__(PerRank)
        other.module = module
        other.sets = sets
        return other

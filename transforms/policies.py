"""Offload policies: which of the tensors a forward trace saves for backward get offloaded.

A policy sees the candidates (intermediates the forward saves for backward, in the order the
trace returns them) and the forward trace, and returns the ones to offload. Policies import
no Thunder at module level, so the matrix can name them without tracing anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Policy(Protocol):
    def select(self, candidates: Sequence[Any], trace: Any) -> Sequence[Any]:
        """The candidates (TensorProxy) to offload."""
        ...


def proxy_bytes(t: Any) -> int:
    numel = 1
    for d in t.shape:
        numel *= d
    return numel * t.dtype.bytes


@dataclasses.dataclass(frozen=True)
class All:
    """Every saved intermediate."""

    def select(self, candidates: Sequence[Any], trace: Any) -> Sequence[Any]:
        return tuple(candidates)


@dataclasses.dataclass(frozen=True)
class LargestFraction:
    """The largest candidates, biggest first, until they hold ``fraction`` of all candidate
    bytes (ties keep trace order)."""

    fraction: float = 0.5

    def select(self, candidates: Sequence[Any], trace: Any) -> Sequence[Any]:
        goal = self.fraction * sum(proxy_bytes(t) for t in candidates)
        chosen, total = set(), 0
        for t in sorted(candidates, key=proxy_bytes, reverse=True):  # sorted() is stable
            if total >= goal:
                break
            chosen.add(t.name)
            total += proxy_bytes(t)
        return tuple(t for t in candidates if t.name in chosen)


@dataclasses.dataclass(frozen=True)
class MinBytes:
    """Candidates of at least ``threshold`` bytes."""

    threshold: int

    def select(self, candidates: Sequence[Any], trace: Any) -> Sequence[Any]:
        return tuple(t for t in candidates if proxy_bytes(t) >= self.threshold)


@dataclasses.dataclass(frozen=True)
class ByOp:
    """Candidates produced by a bound symbol whose name is one of ``ops`` (e.g. "linear")."""

    ops: tuple[str, ...]

    def select(self, candidates: Sequence[Any], trace: Any) -> Sequence[Any]:
        from thunder.core.utils import producers

        made_by = producers(trace)  # keyed by proxy
        return tuple(t for t in candidates if t in made_by and made_by[t].sym.name in self.ops)


@dataclasses.dataclass(frozen=True)
class Callback:
    """A user's function of (candidates, forward trace)."""

    fn: Callable[[Sequence[Any], Any], Sequence[Any]]

    def select(self, candidates: Sequence[Any], trace: Any) -> Sequence[Any]:
        return tuple(self.fn(candidates, trace))

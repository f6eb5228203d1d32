"""The time this rank spends inside calls into the Thunder module (its setup, forward,
backward, optimizer steps, and a scenario's calls), for the kit's share of a cell: the rest
of a cell's run is the kit's (the eager model, its twin, gathering, measuring, checks)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from conformance.rank import progress

_spent = 0.0


@contextlib.contextmanager
def thunder_call(what: str = "a Thunder call") -> Iterator[None]:
    """Time the block as the Thunder module's work; ``what`` names it as the rank's phase."""
    global _spent
    began = time.perf_counter()
    try:
        with progress.phase(what):
            yield
    finally:
        _spent += time.perf_counter() - began


def restart() -> None:
    """A new cell begins."""
    global _spent
    _spent = 0.0


def thunder_s() -> float:
    return _spent

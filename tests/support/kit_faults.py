"""Faults planted in the kit itself (not in Thunder), to show that the kit's own failures are
reported as pytest errors naming the frame that raised, and Thunder's failures never are.

Each is a context manager entered in every rank for one cell, like a planted bug's patch (tests/planted/);
``run_cell_with_fault`` is the rank-side entry point (tests/support/plant_plugin.py names it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest


@contextlib.contextmanager
def memory_check_crashes() -> Iterator[None]:
    """One area's check raises on what it reads (a missing key): that area alone errs."""
    from conformance.checks.registry import AREAS

    def check(record: Any) -> Any:
        return {}["a metric the check wrongly expects"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(AREAS, "memory", dataclasses.replace(AREAS["memory"], check=check))
        yield


@contextlib.contextmanager
def kit_assumes_missing_api() -> Iterator[None]:
    """The kit's setup reaches for an attribute this Thunder lacks (as it once did with
    ``TraceTag.BACKWARD`` on 0.2.1): every area of the cell errs."""
    import thunder.core.trace

    from conformance.rank import entry

    original = entry.record_setup

    def record_setup(*args: Any) -> Any:
        _ = thunder.core.trace.TraceTag.A_TAG_NO_THUNDER_HAS
        return original(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(entry, "record_setup", record_setup)
        yield


@contextlib.contextmanager
def thunder_raises() -> Iterator[None]:
    """Thunder itself raises while sharding: Thunder's failure, never the kit's."""
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    def transform_module(self: Any, model: Any) -> Any:
        raise RuntimeError("planted: Thunder cannot shard this model")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FSDPTransform, "transform_module", transform_module)
        yield


FAULTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    f.__name__: f for f in (memory_check_crashes, kit_assumes_missing_api, thunder_raises)
}


# rank_lost: the pytest process names, per cell id, the phase and how rank 1 is lost there
# (JSON [phase, how] in this variable, armed as --chaos arms a fault: tests/support/plant_plugin.py);
# a cell it does not name runs clean
LOST_AT_ENV = "CONFORMANCE_LOST_AT"


def run_cell_with_fault(
    fault: str,
    axes: dict[str, Any],
    declared: Sequence[str] = (),
    plain_jit: bool = True,
    checkpoint: str | None = None,
) -> dict[str, Any]:
    from conformance.rank.entry import run_cell

    with FAULTS[fault]():
        return run_cell(axes, declared, plain_jit, checkpoint)


# Faults of the composition probe (plant_plugin swaps the probe's task, not the cell's).
PROBE_FAULTS = ("probe_rank_killed_once", "probe_rank_stopped_once", "probe_node_lost_once", "probe_rank_killed_always")


def probe_with_fault(fault: str, marker: str) -> Any:
    """Rank 1 kills (SIGKILL) or stops (SIGSTOP) itself, or is lost with its node (another
    machine's rank: its agent, torchrun and itself killed), while probing: at the first probe
    only, or every time; ``marker`` (a folder the pytest process made) remembers the first
    across worlds."""
    from conformance.rank.faults import HOW, loses
    from conformance.rank.probe import probe_compositions

    first = not os.path.exists(os.path.join(marker, "lost"))
    how = "stop" if "_stopped_" in fault else "node" if "_node_" in fault else "kill"
    if loses(1, how) and (first or fault.endswith("_always")):
        open(os.path.join(marker, "lost"), "w").close()
        HOW[how]()
    return probe_compositions()

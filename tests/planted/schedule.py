"""Bugs in when Thunder issues collectives and waits for them: its sort_waits pass
undone or half undone on the joint forward-backward trace. Every value stays the same (a
wait depends only on its future, a parameter's all-gather only on the parameter), so
numerics, the collectives' counts and the held memory cannot see them; only the schedule
area can."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.planted.cells import ALL, DDP, FSDP, NONE, Pred
from tests.planted.record import Expect, planted

GRADIENT_REDUCTIONS = ("reduce_scatter", "all_reduce")
# the gross bugs run on ci's first FSDP cell (fsdp_jit there), the ones near the threshold
# on the other FSDP composition, each beside a DDP cell
JIT_FSDP: Pred = lambda c: c.composition == "jit_fsdp"  # noqa: E731


@contextlib.contextmanager
def _after_sort_waits(edit: Callable[[list[Any]], list[Any]]) -> Iterator[None]:
    """Thunder's maybe_sort_waits, then ``edit`` of the sorted trace's bound symbols."""
    utils = importlib.import_module("thunder.distributed.utils")  # the package's ``utils`` is thunder.core's
    original = utils.maybe_sort_waits

    def maybe_sort_waits(trace: Any) -> tuple[bool, Any]:
        changed, trace = original(trace)
        if changed:
            trace.bound_symbols = edit(list(trace.bound_symbols))
        return changed, trace

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(utils, "maybe_sort_waits", maybe_sort_waits)
        yield


def _pairs(bsyms: list[Any]) -> list[tuple[str, Any, Any]]:
    """(kind, collective, its wait) in the order the collectives are issued."""
    from conformance.checks.timeline import wait_ids
    from conformance.checks.traces import symbol_kinds

    kinds, waits = symbol_kinds(), wait_ids()
    wait_of = {b.flat_proxy_args[0].name: b for b in bsyms if b.sym.id in waits}
    return [
        (kinds[b.sym.id], b, wait_of[b.flat_proxy_outs[0].name])
        for b in bsyms
        if b.sym.id in kinds and b.flat_proxy_outs[0].name in wait_of
    ]


def _wait_right_after(bsyms: list[Any], collective: Any, wait: Any) -> list[Any]:
    bsyms.remove(wait)
    bsyms.insert(bsyms.index(collective) + 1, wait)
    return bsyms


def _issue_right_before(bsyms: list[Any], collective: Any, wait: Any) -> list[Any]:
    bsyms.remove(collective)
    bsyms.insert(bsyms.index(wait), collective)
    return bsyms


@planted({"schedule": Expect(ALL, NONE, "waits when needed")}, cells=(FSDP, DDP))
@contextlib.contextmanager
def waits_right_after_collectives() -> Iterator[None]:
    """Every wait right after its collective: nothing overlaps any communication."""

    def edit(bsyms: list[Any]) -> list[Any]:
        for _, collective, wait in _pairs(bsyms):
            bsyms = _wait_right_after(bsyms, collective, wait)
        return bsyms

    with _after_sort_waits(edit):
        yield


# The backward's first gradient reduction is followed by the other gradients' compute in
# every model (each has more than one trainable storage), which its wait now blocks.
@planted(
    {"schedule": Expect(ALL, NONE, "reduce_scatter waits when needed | all_reduce waits when needed")},
    cells=(JIT_FSDP, DDP),
)
@contextlib.contextmanager
def first_gradient_wait_right_after() -> Iterator[None]:
    """Only the first gradient reduction (reduce-scatter, all-reduce) of the backward is
    waited right after it is issued; every other wait stays where sort_waits put it."""

    def edit(bsyms: list[Any]) -> list[Any]:
        for kind, collective, wait in _pairs(bsyms):
            if kind in GRADIENT_REDUCTIONS:
                return _wait_right_after(bsyms, collective, wait)
        return bsyms

    with _after_sort_waits(edit):
        yield


@planted({"schedule": Expect(FSDP, NONE, "all_gathers issued when ready")}, cells=(FSDP, DDP))
@contextlib.contextmanager
def prefetch_disabled() -> Iterator[None]:
    """Each all-gather issued just before its wait: no parameter is prefetched while the
    layers before it compute (DDP gathers nothing: its cells conform)."""

    def edit(bsyms: list[Any]) -> list[Any]:
        for kind, collective, wait in _pairs(bsyms):
            if kind == "all_gather":
                bsyms = _issue_right_before(bsyms, collective, wait)
        return bsyms

    with _after_sort_waits(edit):
        yield


# The last all-gather waited in the forward is the last layer's: compute of earlier layers
# precedes its wait in every model, so issuing it there leaves that compute unoverlapped.
@planted({"schedule": Expect(FSDP, NONE, "all_gathers issued when ready")}, cells=(JIT_FSDP, DDP))
@contextlib.contextmanager
def last_gather_not_prefetched() -> Iterator[None]:
    """Only the all-gather waited last is issued just before its wait; the others are
    prefetched as sort_waits orders them."""

    def edit(bsyms: list[Any]) -> list[Any]:
        gathers = [(collective, wait) for kind, collective, wait in _pairs(bsyms) if kind == "all_gather"]
        if not gathers:
            return bsyms
        collective, wait = max(gathers, key=lambda pair: bsyms.index(pair[1]))
        return _issue_right_before(bsyms, collective, wait)

    with _after_sort_waits(edit):
        yield

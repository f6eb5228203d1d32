"""When a trace issues each collective and waits for it, read through bound symbols: a
position per top-level bound symbol, what each one is (a collective, a wait, compute or
bookkeeping) and which waits it needs, directly or through what it reads.

A fusion region is one position: the collectives and waits inside it run when it runs. The
bookkeeping symbols (``del``, unpacking, comments, the return, clearing a collection, the
reference offloading transform's copies) do no work a collective could overlap.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from conformance.checks.traces import symbol_kinds

COMPUTE, COLLECTIVE, WAIT, BOOKKEEPING = "compute", "collective", "wait", "bookkeeping"


@dataclasses.dataclass
class Issue:
    """One collective: where it is issued and where (if anywhere) it is waited for."""

    kind: str
    at: int  # position of the top-level bound symbol that issues it
    name: str  # the proxy it sends (the sharded parameter, the gradient), for findings
    future: str | None  # the future it returns; None: issued synchronously
    ready: int  # position of the last non-bookkeeping producer of its inputs; -1: the trace's inputs
    waited: int | None = None  # position of its wait
    wait_outputs: tuple[str, ...] = ()


@dataclasses.dataclass
class Timeline:
    roles: list[str]  # per position
    names: list[str]  # per position: the symbol's name
    issues: list[Issue]
    # per position: bit k set where the symbol needs, transitively, the k-th wait (in trace order)
    needs: list[int]
    wait_positions: list[int]  # the k-th wait's position
    stray_waits: list[tuple[int, str]]  # (position, future) of waits no collective of the trace issued
    consumers: dict[str, list[int]]  # proxy name -> positions of the non-bookkeeping symbols reading it

    def compute_between(self, first: int, last: int) -> list[int]:
        """Positions of compute and waits strictly between ``first`` and ``last``."""
        return [i for i in range(first + 1, last) if self.roles[i] in (COMPUTE, WAIT)]


@functools.cache
def wait_ids() -> frozenset[Any]:
    import thunder.executors.torchex as torchex
    from thunder.distributed.prims import PrimIDs

    return frozenset({PrimIDs.WAIT, torchex.wait_prim_impl.id})


@functools.cache
def _bookkeeping_ids() -> frozenset[Any]:
    from thunder.core.prims import PrimIDs
    from thunder.executors.pythonex import clear_mutable_collection

    from transforms.offload import load, offload

    unpacks = {v for k, v in PrimIDs.__members__.items() if k.startswith("UNPACK")}
    return frozenset({PrimIDs.DEL, PrimIDs.RETURN, PrimIDs.COMMENT, clear_mutable_collection.id, offload.id, load.id}
                     | unpacks)  # fmt: skip


def _inner(bsym: Any) -> list[tuple[str, Any]]:
    """(collective kind or WAIT, bound symbol) inside a fusion region, nested regions included."""
    kinds, waits, found = symbol_kinds(), wait_ids(), []
    for sub in bsym.subsymbols:
        if sub.sym.id in kinds:
            found.append((kinds[sub.sym.id], sub))
        elif sub.sym.id in waits:
            found.append((WAIT, sub))
        elif getattr(sub.sym, "is_fusion", False):
            found += _inner(sub)
    return found


def _name(proxy: Any) -> str | None:
    return getattr(proxy, "name", None)


def timeline(trace: Any) -> Timeline:
    """``trace``'s collectives and waits by position, and what each position needs."""
    kinds, waits, bookkeeping = symbol_kinds(), wait_ids(), _bookkeeping_ids()
    roles: list[str] = []
    names: list[str] = []
    needs: list[int] = []
    producer: dict[str, int] = {}  # proxy name -> position of its first producer
    issues: list[Issue] = []
    by_future: dict[str, Issue] = {}
    wait_positions: list[int] = []
    stray: list[tuple[int, str]] = []
    consumers: dict[str, list[int]] = {}
    for at, bsym in enumerate(trace.bound_symbols):
        sid = bsym.sym.id
        inside = _inner(bsym) if getattr(bsym.sym, "is_fusion", False) else []
        if sid in kinds:
            inside, role = [(kinds[sid], bsym)], COLLECTIVE
        elif sid in waits:
            inside, role = [(WAIT, bsym)], WAIT
        elif sid in bookkeeping:
            role = BOOKKEEPING
        else:
            role = WAIT if any(k == WAIT for k, _ in inside) else COMPUTE
        args = [n for n in map(_name, bsym.flat_proxy_args) if n is not None]
        need = 0
        for n in args:
            if n in producer:
                need |= needs[producer[n]]
            if role != BOOKKEEPING:
                consumers.setdefault(n, []).append(at)
        for kind, sym in inside:
            if kind == WAIT:
                future = _name(sym.flat_proxy_args[0]) if sym.flat_proxy_args else None
                issue = by_future.get(future) if future is not None else None
                if issue is None or issue.waited is not None:
                    stray.append((at, future or "(no future)"))
                else:
                    issue.waited = at
                    issue.wait_outputs = tuple(n for n in map(_name, sym.flat_proxy_outs) if n is not None)
                need |= 1 << len(wait_positions)
                wait_positions.append(at)
            else:
                within = set(args) if sym is not bsym else None  # a region's own inputs
                issues.append(_issue(kind, at, sym, producer, roles, within))
                if issues[-1].future is not None:
                    by_future[issues[-1].future] = issues[-1]
        for out in bsym.flat_proxy_outs:
            n = _name(out)
            if n is not None and n not in producer and n not in args:
                producer[n] = at
        roles.append(role)
        names.append(str(bsym.sym.name))
        needs.append(need)
    return Timeline(roles, names, issues, needs, wait_positions, stray, consumers)


def _issue(kind: str, at: int, sym: Any, producer: dict[str, int], roles: list[str], within: set[str] | None) -> Issue:
    """A collective issued at ``at``; ``within``: the inputs of the fusion region holding it
    (an input not among them is made inside the region: ready where the region runs)."""
    from thunder.core.proxies import FutureTensorProxy

    inputs = [n for n in map(_name, sym.flat_proxy_args) if n is not None]
    made = [producer[n] for n in inputs if n in producer and roles[producer[n]] != BOOKKEEPING]
    if within is not None and any(n not in within for n in inputs):
        made.append(at)
    out = sym.flat_proxy_outs[0] if sym.flat_proxy_outs else None
    future = out.name if isinstance(out, FutureTensorProxy) else None
    return Issue(kind, at, inputs[0] if inputs else "(no input)", future, max(made, default=-1))

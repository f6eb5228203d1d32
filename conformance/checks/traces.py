"""Thunder's final execution traces of a cell, and the collectives in them, read through
bound symbols (never the printed trace)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

KINDS = ("all_gather", "reduce_scatter", "all_reduce")


@dataclasses.dataclass(frozen=True)
class FinalTraces:
    forward: Any
    backward: Any

    def by_phase(self) -> dict[str, Any]:
        return {"forward": self.forward, "backward": self.backward}


def final_traces(thunder_module: Any) -> FinalTraces:
    """The forward and backward traces Thunder last executed for the module (None for a phase
    it kept none of: each area that reads it says so)."""
    import thunder

    if thunder.compile_data(thunder_module) is None:  # not Thunder's (a composition of PyTorch's parallelism)
        return FinalTraces(None, None)
    return FinalTraces(_last(thunder.last_traces(thunder_module)), _last(thunder.last_backward_traces(thunder_module)))


def _last(traces: Any) -> Any:
    return traces[-1] if traces else None


MISSING = "Thunder kept no {} trace for the module"


@functools.cache
def symbol_kinds() -> dict[Any, str]:
    """Symbol ids of each collective: the distributed prim and the torch executor's impl."""
    import thunder.executors.torchex as torchex
    from thunder.distributed.prims import PrimIDs

    return {
        PrimIDs.ALL_GATHER: "all_gather",
        torchex.all_gather_prim_impl.id: "all_gather",
        PrimIDs.REDUCE_SCATTER: "reduce_scatter",
        torchex.reduce_scatter_prim_impl.id: "reduce_scatter",
        PrimIDs.ALL_REDUCE: "all_reduce",
        torchex.all_reduce_prim_impl.id: "all_reduce",
    }


def issued(trace: Any) -> list[tuple[str, Any]]:
    """The collectives ``trace`` executes, in order, as (kind, bound symbol): its top-level
    bound symbols, and those inside fusion regions (an executor such as torch.compile's may
    fuse a collective into a region, where it still runs). A collective's own sub-symbols
    are never read: they would count one collective twice."""
    kinds = symbol_kinds()
    found: list[tuple[str, Any]] = []

    def visit(bsyms: Any) -> None:
        for bsym in bsyms:
            kind = kinds.get(bsym.sym.id)
            if kind is not None:
                found.append((kind, bsym))
            elif getattr(bsym.sym, "is_fusion", False):
                visit(bsym.subsymbols)

    visit(trace.bound_symbols)
    return found


def group_ranks(bsym: Any) -> tuple[int, ...] | None:
    """The global ranks of the process group a collective's bound symbol issues on (its
    ``ProcessGroup`` argument), None where it names none."""
    import torch.distributed as dist

    group = next((a for a in bsym.flat_args if isinstance(a, dist.ProcessGroup)), None)
    return None if group is None else tuple(dist.get_process_group_ranks(group))


def collective_symbols(trace: Any) -> dict[str, list[Any]]:
    """``issued`` by kind."""
    by_kind: dict[str, list[Any]] = {k: [] for k in KINDS}
    for kind, bsym in issued(trace):
        by_kind[kind].append(bsym)
    return by_kind

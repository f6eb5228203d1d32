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
    """The forward and backward traces Thunder last executed for the module."""
    import thunder

    return FinalTraces(thunder.last_traces(thunder_module)[-1], thunder.last_backward_traces(thunder_module)[-1])


@functools.cache
def _symbol_kinds() -> dict[Any, str]:
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


def collective_symbols(trace: Any) -> dict[str, list[Any]]:
    """Top-level bound symbols of ``trace`` by collective kind (their sub-symbols would
    count one collective twice)."""
    found: dict[str, list[Any]] = {k: [] for k in KINDS}
    kinds = _symbol_kinds()
    for bsym in trace.bound_symbols:
        kind = kinds.get(bsym.sym.id)
        if kind is not None:
            found[kind].append(bsym)
    return found

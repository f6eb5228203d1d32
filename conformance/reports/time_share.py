"""Where a run's time went: the Thunder module's own work against the kit's around it.

A cell's run (``cell_run_s``, the controller's clock from handing the task to the last
answer) is the Thunder module's setup, training and scenario calls (``timings.thunder_s``,
rank 0's clock) plus everything the kit does: the eager model and its float32 twin,
gathering, measuring, the state-dict round trip, the checks, the answers' transport.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

HEAVIEST = 3


@dataclasses.dataclass(frozen=True)
class CellTime:
    cell: str
    run_s: float
    thunder_s: float

    @property
    def kit_s(self) -> float:
        return max(self.run_s - self.thunder_s, 0.0)


@dataclasses.dataclass(frozen=True)
class TimeShare:
    cells: list[CellTime]

    @property
    def run_s(self) -> float:
        return sum(c.run_s for c in self.cells)

    @property
    def thunder_s(self) -> float:
        return sum(c.thunder_s for c in self.cells)

    @property
    def kit_s(self) -> float:
        return sum(c.kit_s for c in self.cells)

    @property
    def kit_share(self) -> float | None:
        return None if not self.run_s else self.kit_s / self.run_s

    def to_json(self) -> dict[str, Any]:
        heaviest = sorted(self.cells, key=lambda c: c.kit_s, reverse=True)[:HEAVIEST]
        return {
            "cells": len(self.cells),
            "cell_run_s": self.run_s,
            "thunder_s": self.thunder_s,
            "kit_s": self.kit_s,
            "kit_share": self.kit_share,
            # where the kit's own time goes first: the cells that cost it the most
            "heaviest": [{"cell": c.cell, "cell_run_s": c.run_s, "kit_s": c.kit_s} for c in heaviest],
        }


def time_share(records: Iterable[dict[str, Any]]) -> TimeShare:
    """Each real cell that ran, once (every area's item carries the same timings)."""
    seen: dict[str, CellTime] = {}
    for rec in records:
        m = rec.get("metrics") or {}
        thunder = (m.get("timings") or {}).get("thunder_s")
        if rec.get("cell") in seen or thunder is None or "cell_run_s" not in m:
            continue
        seen[rec["cell"]] = CellTime(rec["cell"], float(m["cell_run_s"]), float(thunder))
    return TimeShare(list(seen.values()))


def section(share: dict[str, Any] | None) -> list[str]:
    """summary.md's lines on it."""
    if not share or not share["cells"]:
        return []
    return [
        f"Time: {share['cells']} cells ran {share['cell_run_s']:.0f} s, the Thunder module's setup, training "
        f"and scenario calls {share['thunder_s']:.0f} s of it; **the kit's share {share['kit_share']:.0%}** "
        "(the eager model and its twin, gathering, measuring, state-dict round trips, checks); most in "
        + ", ".join(f"`{c['cell']}` ({c['kit_s']:.0f} of {c['cell_run_s']:.0f} s)" for c in share["heaviest"])
        + ".",
        "",
    ]

"""A report's simulated cells (conformance/rank/simulate.py), regrouped for summary.md and
scale.png: one entry per cell, each area's outcome and each sampled rank's metrics.

A simulated cell's item keeps the first sampled rank's metrics at the top and every sampled
rank's under ``"per rank"`` (keyed by the rank as a string); the reports read the latter,
since the point of sampling ranks is to see where they disagree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from conformance.reports.outcomes import MARKS


@dataclasses.dataclass
class SimulatedCell:
    cell: str
    model: str
    tie: str
    dtype: str
    world_size: int
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)  # area -> outcome
    per_rank: dict[str, dict[int, dict[str, Any]]] = dataclasses.field(default_factory=dict)  # area -> rank -> metrics

    @property
    def ranks(self) -> list[int]:
        """The sampled ranks that reported metrics in any area."""
        return sorted({rank for by_rank in self.per_rank.values() for rank in by_rank})

    def metric(self, area: str, name: str) -> dict[int, Any]:
        """Each sampled rank's value of ``name`` in ``area``, where that rank recorded it."""
        return {rank: m[name] for rank, m in sorted(self.per_rank.get(area, {}).items()) if name in m}


def simulated_cells(report: dict[str, Any]) -> list[SimulatedCell]:
    """The report's simulated cells in the order their first item ran."""
    cells: dict[str, SimulatedCell] = {}
    for item in report["cells"]:
        axes = item.get("axes") or {}
        if not axes.get("simulated"):
            continue
        cell = cells.setdefault(
            item["cell"],
            SimulatedCell(item["cell"], axes["model"], axes["tie"], axes["dtype"], int(axes["world_size"])),
        )
        cell.outcomes[item["area"]] = item["outcome"]
        metrics = item.get("metrics") or {}
        if "per rank" in metrics:
            cell.per_rank[item["area"]] = {int(rank): m for rank, m in metrics["per rank"].items()}
        elif metrics:  # no per-rank split recorded: the top level is the first sampled rank's
            cell.per_rank[item["area"]] = {0: metrics}
    return list(cells.values())


NOT_CHECKED = (
    "A simulated world moves no data (torch's fake process group; a few sampled ranks stand for "
    "the world), so numerics, state dicts, materialization and offloading are not checked there: "
    "only collectives, memory and sharding."
)


def section(report: dict[str, Any], figure: str | None) -> list[str]:
    """summary.md's "Simulated worlds": one row per simulated cell; nothing without one."""
    cells = simulated_cells(report)
    if not cells:
        return []
    intro = NOT_CHECKED
    if figure:
        intro += f" Per-rank memory and all-gathered bytes against world size: [{figure}]({figure}), below."
    lines = [
        "## Simulated worlds",
        "",
        intro,
        "",
        "| cell | sampled ranks | collectives | memory | sharding | shard bytes per rank "
        "| forward all-gathers (actual / expected) | forward all-gathered bytes (actual / expected) "
        "| collective sequence digest | held after setup (measured / bound) | setup peak (measured / bound) |",
        "|" + "---|" * 11,
    ]
    for c in cells:
        marks = [MARKS.get(c.outcomes.get(area, ""), "–") for area in ("collectives", "memory", "sharding")]
        digests = c.metric("collectives", "collective sequence digest")
        shown = [
            _agreed({r: _bytes(v["actual"]) for r, v in c.metric("sharding", "shard bytes").items()}),
            _agreed(_pairs(c.metric("collectives", "forward all_gathers"), "actual", "expected")),
            _agreed(_pairs(c.metric("collectives", "forward all-gathered bytes"), "actual", "expected")),
            _agreed({r: f"`{d}`" for r, d in digests.items()}, differs="differs: "),
            _agreed(_pairs(c.metric("memory", "retained after setup"), "measured", "bound")),
            _agreed(_pairs(c.metric("memory", "setup peak"), "measured", "bound")),
        ]
        ranks = ", ".join(map(str, c.ranks)) or "–"
        lines.append(f"| `{c.cell}` | {ranks} | " + " | ".join([*marks, *shown]) + " |")
    if figure:
        lines += ["", f"![per-rank memory and all-gathered bytes against world size]({figure})"]
    return [*lines, ""]


def _bytes(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def _pairs(values: dict[int, dict[str, Any]], first: str, second: str) -> dict[int, str]:
    return {r: f"{_bytes(v.get(first))} / {_bytes(v.get(second))}" for r, v in values.items()}


def _agreed(values: dict[int, str], differs: str = "") -> str:
    """One value where every sampled rank recorded the same, else each rank's."""
    if not values:
        return "–"
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    return differs + "; ".join(f"{rank}: {v}" for rank, v in values.items())

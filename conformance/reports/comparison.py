"""Two runs compared: which items changed outcome, which appeared or vanished, and which
metrics moved beyond run-to-run noise (``noise.py`` says how much each moves and where that
was measured).

A regression is an item that fails or errors now and did not before (a new item that fails
included: nothing said it would), or a metric beyond noise in the bad direction (more
memory, more collectives or bytes gathered, more time). Everything else is reported and
leaves the comparison clean.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from conformance.reports.noise import COLLECTIVES, MEMORY, TIMING, Noise, noise, thresholds

BAD = ("failed", "error")

# kinds of an item's change, in the order the Markdown lists them
NEWLY_FAILING = "newly failing"
NEWLY_ERRORING = "newly erroring"
FIXED = "fixed"
NEW_XPASS = "new xpass"
CHANGED = "outcome changed"
NEW_ITEM = "new item"
VANISHED = "vanished"
KINDS = (NEWLY_FAILING, NEWLY_ERRORING, FIXED, NEW_XPASS, CHANGED, NEW_ITEM, VANISHED)

LISTED = 50  # entries per list in the Markdown; the JSON has all


class UnreadableReport(Exception):
    """A path that holds no report of the kit; the message is one line."""


def read_report(path: Path) -> dict[str, Any]:
    """A report.json of the kit, or a report folder holding one."""
    file = path / "report.json" if path.is_dir() else path
    if not file.is_file():
        raise UnreadableReport(f"{path}: no report.json there" if path.is_dir() else f"{path}: no such file")
    try:
        report = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnreadableReport(f"{file}: not JSON ({e})") from None
    cells = report.get("cells") if isinstance(report, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) and "id" in c and "outcome" in c for c in cells):
        raise UnreadableReport(f"{file}: not a report of the kit (no list of cells with id and outcome)")
    return report


@dataclasses.dataclass(frozen=True)
class RunInfo:
    name: str
    thunder: str | None
    backend: str | None
    profile: str | None
    started: str | None
    items: int
    counts: dict[str, int]

    @classmethod
    def of(cls, name: str, report: dict[str, Any]) -> RunInfo:
        env = report.get("environment") or {}
        return cls(
            name=name,
            thunder=env.get("thunder"),
            backend=env.get("backend"),
            profile=report.get("profile"),
            started=report.get("started"),
            items=len(report["cells"]),
            counts=report.get("counts") or {},
        )


@dataclasses.dataclass(frozen=True)
class ItemChange:
    item: str  # the node id
    cell: str | None  # None for items that are not a cell's (generated models)
    area: str | None
    old: str | None  # outcome; None where the item is absent
    new: str | None
    kind: str  # one of KINDS

    @property
    def regression(self) -> bool:
        return self.kind in (NEWLY_FAILING, NEWLY_ERRORING)


@dataclasses.dataclass(frozen=True)
class MetricChange:
    cell: str  # the cell id, or the item's id where it is no cell's
    area: str | None  # None for a cell's timings, which every area of it shares
    metric: str
    kind: str  # MEMORY, COLLECTIVES or TIMING
    old: float
    new: float
    noise: Noise

    @property
    def regression(self) -> bool:  # every metric compared is better smaller
        return self.new > self.old


@dataclasses.dataclass(frozen=True)
class Comparison:
    old: RunInfo
    new: RunInfo
    items: list[ItemChange]
    metrics: list[MetricChange]  # only those beyond noise

    @property
    def regressions(self) -> int:
        return sum(c.regression for c in self.items) + sum(m.regression for m in self.metrics)

    def to_json(self) -> dict[str, Any]:
        return {
            "old": dataclasses.asdict(self.old),
            "new": dataclasses.asdict(self.new),
            "regressions": self.regressions,
            "items": [{**dataclasses.asdict(c), "regression": c.regression} for c in self.items],
            "metrics": [
                {**dataclasses.asdict(m), "noise": m.noise.describe(), "regression": m.regression} for m in self.metrics
            ],
            "thresholds": {what: n.describe() for what, n in thresholds().items()},
        }


def compare(old: dict[str, Any], new: dict[str, Any], old_name: str = "old", new_name: str = "new") -> Comparison:
    """What changed from the report ``old`` to the report ``new``."""
    before = {c["id"]: c for c in old["cells"]}
    after = {c["id"]: c for c in new["cells"]}
    items = [
        change
        for item in [*before, *(i for i in after if i not in before)]
        if (change := _item_change(item, before.get(item), after.get(item))) is not None
    ]
    items.sort(key=lambda c: (KINDS.index(c.kind), c.cell or c.item, c.area or ""))
    old_metrics, new_metrics = metrics(old["cells"]), metrics(new["cells"])
    changed = []
    for key, (kind, was) in old_metrics.items():
        if key not in new_metrics:
            continue
        now = new_metrics[key][1]
        threshold = noise(kind, key[2])
        if threshold.beyond(was, now):
            changed.append(MetricChange(*key, kind=kind, old=was, new=now, noise=threshold))
    changed.sort(key=lambda m: (not m.regression, m.kind, m.cell, m.area or "", m.metric))
    return Comparison(RunInfo.of(old_name, old), RunInfo.of(new_name, new), items, changed)


def _item_change(item: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> ItemChange | None:
    was = old["outcome"] if old else None
    now = new["outcome"] if new else None
    if was == now:
        return None
    if new is None:
        kind = VANISHED
    elif now == "error":  # a new item that errors or fails is a regression too: nothing said it would
        kind = NEWLY_ERRORING
    elif now == "failed" and was != "error":
        kind = NEWLY_FAILING
    elif old is None:
        kind = NEW_ITEM
    elif was in BAD and now not in BAD:
        kind = FIXED
    elif now == "xpassed":
        kind = NEW_XPASS
    else:
        kind = CHANGED
    either = new or old or {}
    return ItemChange(item, either.get("cell"), either.get("area"), was, now, kind)


def metrics(items: Iterable[dict[str, Any]]) -> dict[tuple[str, str | None, str], tuple[str, float]]:
    """(cell, area, metric) -> (kind, value): what a comparison reads of a report's items.

    Memory: each phase's measured peak of a memory item and what an offload item's forward
    left allocated; collectives: every count and byte total an item measured (``actual``);
    timings: each cell's ``cell_run_s`` and ``timings`` (once: every area of a cell carries
    the same) and the duration of items that are no cell's (generated models)."""
    found: dict[tuple[str, str | None, str], tuple[str, float]] = {}
    for item in items:
        m = item.get("metrics") or {}
        cell, area = item.get("cell"), item.get("area")
        if cell is None:
            if isinstance(item.get("duration"), (int, float)):
                found[(item["id"], None, "duration")] = (TIMING, item["duration"])
            continue
        if area == MEMORY:
            peaks = m.get("measured") or {  # reports before "measured" kept each phase's peak apart
                k.removesuffix(" peak"): v["measured"] for k, v in m.items() if k.endswith(" peak") and "measured" in v
            }
            for phase, value in peaks.items():
                found[(cell, area, f"{phase} peak")] = (MEMORY, value)
        held = m.get("held after forward")
        if isinstance(held, dict) and "measured" in held:
            found[(cell, area, "held after forward")] = (MEMORY, held["measured"])
        if area == COLLECTIVES:
            for name, value in m.items():
                if isinstance(value, dict) and isinstance(value.get("actual"), (int, float)):
                    found[(cell, area, name)] = (COLLECTIVES, value["actual"])
        if "cell_run_s" in m and (cell, None, "cell_run_s") not in found:
            found[(cell, None, "cell_run_s")] = (TIMING, m["cell_run_s"])
            for name, value in (m.get("timings") or {}).items():
                found[(cell, None, name)] = (TIMING, value)
    return found

"""Two runs compared: which items changed outcome, which appeared or vanished, and which
metrics moved beyond run-to-run noise (``noise.py`` says how much each moves and where that
was measured).

Every old → new outcome pair of an item (absent: not in that report), and why:

- passed → xfailed, unsupported or skipped: **capability lost**, a regression. The item
  conformed and now is excused or tests nothing: a composition or executor the Thunder under
  test stopped offering (unsupported says why), an xfails entry that now covers it. xpassed
  counts as passed (it conformed; the kit's strict xfails never write it).
- any → absent: **vanished**, a regression (capability lost too): the new run says nothing of
  the item, so nothing shows the capability holds; a composition that Thunder stops offering
  drops its cells out of the covering array.
- any → xfailed where the new run's ``--chaos`` lost a rank in the item's cell and the item
  said so (its ``chaos`` verdict, conformance/frontend/chaos.py): faulted by --chaos, no
  regression: the kit planned it, and the item's own account of it was checked.
- any but error → error: newly erroring; any but failed or error → failed: newly failing. Both
  regressions, a new item included: nothing said it would. A newly failing item that an
  xfails entry for other Thunder versions would explain (``known_elsewhere``) is one too,
  named with those versions ("known on ..."): upstream's, on a version the file does not declare.
- failed or error → anything but failed or error: fixed. failed → xfailed or unsupported is no
  capability lost: the item did not conform, so nothing conforming was lost.
- anything not failing → xpassed: a new xpass. error → failed, xpassed → passed, and xfailed,
  unsupported or skipped → passed, xfailed, unsupported or skipped: another change (no
  regression: nothing that conformed is lost). absent → anything not failing: a new item.

A metric beyond noise in the bad direction (more memory, more collectives or bytes gathered,
more time) is a regression too. A regression named by an accepted pattern (its item id, cell
id or area, equal or matching as an fnmatch glob) is an intended change: listed as accepted,
not counted.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from conformance.reports.noise import COLLECTIVES, MEMORY, TIMING, Noise, noise, thresholds
from conformance.reports.outcomes import CHAOS_LOST, excuse

BAD = ("failed", "error")
CONFORMING = ("passed", "xpassed")
EXCUSED = ("xfailed", "unsupported", "skipped")  # what a conforming item may become without failing

# kinds of an item's change, in the order the Markdown lists them
CAPABILITY_LOST = "capability lost"
VANISHED = "vanished"
NEWLY_FAILING = "newly failing"
NEWLY_ERRORING = "newly erroring"
FIXED = "fixed"
NEW_XPASS = "new xpass"
CHANGED = "outcome changed"
NEW_ITEM = "new item"
FAULTED = "faulted by --chaos"  # xfailed where the run's --chaos lost a rank, as planned: no regression
KINDS = (CAPABILITY_LOST, VANISHED, NEWLY_FAILING, NEWLY_ERRORING, FIXED, NEW_XPASS, CHANGED, NEW_ITEM, FAULTED)
REGRESSIONS = (CAPABILITY_LOST, VANISHED, NEWLY_FAILING, NEWLY_ERRORING)
LOSSES = (CAPABILITY_LOST, VANISHED)

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
    reason: str | None = None  # why it is excused now: an unsupported item's reason, an xfailed one's entry
    accepted: bool = False  # a regression that an accepted pattern names: an intended change
    # a newly failing item's xfails entries for other Thunder versions (their specifiers): an
    # upstream non-conformance on a version the file does not declare, not a new one
    known_on: str | None = None

    @property
    def regression(self) -> bool:
        return self.kind in REGRESSIONS


@dataclasses.dataclass(frozen=True)
class MetricChange:
    cell: str  # the cell id, or the item's id where it is no cell's
    area: str | None  # None for a cell's timings, which every area of it shares
    metric: str
    kind: str  # MEMORY, COLLECTIVES or TIMING
    old: float
    new: float
    noise: Noise
    accepted: bool = False

    @property
    def regression(self) -> bool:  # every metric compared is better smaller
        return self.new > self.old


@dataclasses.dataclass(frozen=True)
class Comparison:
    old: RunInfo
    new: RunInfo
    items: list[ItemChange]
    metrics: list[MetricChange]  # only those beyond noise
    accept: tuple[str, ...] = ()  # the accepted patterns, as given
    unused: tuple[str, ...] = ()  # accepted patterns that name no regression

    @property
    def regressions(self) -> int:
        """Regressions not accepted: what sets the exit status."""
        changes: list[ItemChange | MetricChange] = [*self.items, *self.metrics]
        return sum(c.regression and not c.accepted for c in changes)

    @property
    def capability_lost(self) -> list[ItemChange]:
        """Items not accepted that conformed before and are excused, skipped or gone now."""
        return [c for c in self.items if c.kind in LOSSES and not c.accepted]

    def to_json(self) -> dict[str, Any]:
        return {
            "old": dataclasses.asdict(self.old),
            "new": dataclasses.asdict(self.new),
            "regressions": self.regressions,
            "capability_lost": len(self.capability_lost),
            "accepted": sum(c.regression and c.accepted for c in [*self.items, *self.metrics]),
            "accept": list(self.accept),
            "accepted_but_unchanged": list(self.unused),
            "items": [{**dataclasses.asdict(c), "regression": c.regression} for c in self.items],
            "metrics": [
                {**dataclasses.asdict(m), "noise": m.noise.describe(), "regression": m.regression} for m in self.metrics
            ],
            "thresholds": {what: n.describe() for what, n in thresholds().items()},
        }


def compare(
    old: dict[str, Any],
    new: dict[str, Any],
    old_name: str = "old",
    new_name: str = "new",
    accept: Iterable[str] = (),
) -> Comparison:
    """What changed from the report ``old`` to the report ``new``; a regression that a pattern
    of ``accept`` names is accepted."""
    accept = tuple(accept)
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
    used: set[str] = set()
    items = [_accepted(c, accepts(accept, c.item, c.cell, c.area), used) for c in items]
    changed = [_accepted(m, accepts(accept, m.cell, m.area), used) for m in changed]
    unused = tuple(p for p in accept if p not in used)
    return Comparison(RunInfo.of(old_name, old), RunInfo.of(new_name, new), items, changed, accept, unused)


def accepts(patterns: Iterable[str], *names: str | None) -> set[str]:
    """The patterns that name one of ``names`` (an item's id, its cell, its area): equal to it
    (an item id's brackets are no glob), or matching it as an fnmatch glob."""
    return {p for p in patterns for n in names if n is not None and (n == p or fnmatch.fnmatchcase(n, p))}


Change = TypeVar("Change", ItemChange, MetricChange)


def _accepted(change: Change, matched: set[str], used: set[str]) -> Change:
    if not change.regression or not matched:
        return change
    used.update(matched)
    return dataclasses.replace(change, accepted=True)


def _item_change(item: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> ItemChange | None:
    was = old["outcome"] if old else None
    now = new["outcome"] if new else None
    if was == now:
        return None
    if new is None:
        kind = VANISHED
    elif now == "xfailed" and (new.get("chaos") or {}).get("verdict") == CHAOS_LOST:
        kind = FAULTED
    elif now == "error":  # a new item that errors or fails is a regression too: nothing said it would
        kind = NEWLY_ERRORING
    elif now == "failed" and was != "error":
        kind = NEWLY_FAILING
    elif old is None:
        kind = NEW_ITEM
    elif was in CONFORMING and now in EXCUSED:
        kind = CAPABILITY_LOST
    elif was in BAD and now not in BAD:
        kind = FIXED
    elif now == "xpassed":
        kind = NEW_XPASS
    else:
        kind = CHANGED
    either = new or old or {}
    reason = excuse(new) if kind == CAPABILITY_LOST and new is not None else None
    elsewhere = ((new or {}).get("known_elsewhere") or []) if kind == NEWLY_FAILING else []
    known_on = "; ".join(dict.fromkeys(", ".join(k["thunder"]) for k in elsewhere)) or None
    return ItemChange(item, either.get("cell"), either.get("area"), was, now, kind, reason, known_on=known_on)


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

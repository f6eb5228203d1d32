"""One step's report.json read as git bisect run's good, bad or skip."""

from __future__ import annotations

import dataclasses
from typing import Any

# git bisect run's meaning of a step's exit status
GOOD, BAD, SKIP, ABORT = 0, 1, 125, 128

# pytest's exit status when it ran to the end: 0 all passed, 1 some failed, 5 nothing selected
COMPLETED = (0, 1, 5)
_WORDS = {GOOD: "good", BAD: "bad", SKIP: "skip"}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One step's answer, read from its report.json."""

    code: int  # GOOD, BAD or SKIP
    reason: str  # one line
    matched: int = 0  # items of the cell in the run
    failures: tuple[str, ...] = ()  # the message of every failed item
    failed_ids: tuple[str, ...] = ()
    nothing_selected: bool = False  # pytest ran to the end and no item was the cell's

    @property
    def word(self) -> str:
        return _WORDS[self.code]


def _is_item_of(record: dict[str, Any], cell_id: str, area: str | None) -> bool:
    # an item whose fixture broke before the cell ran has no "cell" yet: its node id still names it
    if record.get("cell") != cell_id and not record.get("id", "").endswith(f"[{cell_id}]"):
        return False
    return area is None or record.get("area", _area_of(record.get("id", ""))) == area


def _area_of(node_id: str) -> str:
    return node_id.partition("::")[0].rpartition("/test_")[2].removesuffix(".py")


def _is_stale(record: dict[str, Any]) -> bool:
    """A failure only because an xfails entry covers a cell that conforms: every rank passed.
    For a bisect the cell conforms there (the entry pins a later Thunder's failure)."""
    ranks = record.get("ranks") or []
    return (
        bool(ranks)
        and all(r.get("status") == "passed" and not r.get("failures") for r in ranks)
        and "but xfails entries cover it" in record.get("message", "")
    )


def _without_repro(message: str) -> str:
    """The item's message less the suite's own repro line, which would run the installed Thunder."""
    return "\n".join(line for line in message.splitlines() if not line.startswith("repro: "))


def verdict(report: dict[str, Any] | None, cell_id: str, area: str | None = None) -> Verdict:
    """Map one step's report.json (None: pytest wrote none) to git bisect's good, bad or skip."""
    if report is None:
        return Verdict(SKIP, "pytest wrote no report.json (it stopped before the session ended)")
    items = [r for r in report.get("cells", []) if _is_item_of(r, cell_id, area)]
    status = report.get("exit_status")
    failed = [r for r in items if r["outcome"] == "failed" and not _is_stale(r)]
    if failed:  # evidence even when the run did not finish
        return Verdict(
            BAD,
            f"{len(failed)} of {len(items)} items failed: " + ", ".join(_area_of(r["id"]) for r in failed),
            matched=len(items),
            failures=tuple(_without_repro(r.get("message", "")) for r in failed),
            failed_ids=tuple(r["id"] for r in failed),
        )
    if status not in COMPLETED:
        return Verdict(SKIP, f"pytest exit status {status}: a collection error, usage error or interrupt", len(items))
    if not items:
        return Verdict(SKIP, f"no item matched {cell_id}" + (f" in area {area}" if area else ""), nothing_selected=True)
    unclear = sorted({r["outcome"] for r in items} - {"passed", "xfailed", "failed"})
    if unclear:
        return Verdict(SKIP, "the kit cannot tell: items " + ", ".join(unclear), len(items))
    return Verdict(GOOD, f"{len(items)} items conform", len(items))

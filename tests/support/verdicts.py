"""An item's verdict judged without a world: the runner stood in for (the xfails entries, the
Thunder version under test, the session's backend) and failures grouped as the ranks report
them, for the unit tests of the verdict, the ledger, known-elsewhere and raises entries."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from conformance.checks.findings import Failure
from conformance.frontend.verdict import Grouped
from conformance.frontend.xfails import Expectation


def stand_in_runner(entries: list[Expectation], version: str | None, backend: str = "gloo", **more: Any) -> Any:
    """What the verdict reads of a Runner: the entries, which of them hold for a cell's area
    (``known``, as Runner.known decides it), the version and backend; ``more`` beside them."""
    return SimpleNamespace(
        expectations=entries,
        thunder_version=version,
        session=SimpleNamespace(backend=backend),
        known=lambda c, a: [e for e in entries if e.covers(c, a, version, backend)],
        **more,
    )


def on_ranks(failures: Iterable[Failure], ranks: tuple[int, ...] = (0, 1)) -> Grouped:
    """``failures``, each reported by every one of ``ranks``."""
    grouped = Grouped()
    for failure in failures:
        grouped.add(failure, list(ranks))
    return grouped

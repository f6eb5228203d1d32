"""The kit's own tests start the costliest first. Two xdist workers share them, taking the next
test as one runs dry: a minutes-long test drawn last leaves the other worker idle while it
finishes, and the seconds-long tests drawn after the long ones fill the gaps instead."""

from __future__ import annotations

import pytest

SLOW_S = 30.0  # a test marked slow without seconds: a suite run of a few cells


def cost(item: pytest.Item) -> float:
    """What ``item`` cost in the last measured run, as its ``slow(seconds=N)`` marker says
    (docs/measurements.md); slow alone ``SLOW_S``; any other test nothing (it takes seconds)."""
    marks = list(item.iter_markers("slow"))
    if not marks:
        return 0.0
    return max(float(m.kwargs.get("seconds", SLOW_S)) for m in marks)


@pytest.hookimpl(trylast=True)  # after the kit's plugin has put its cells in order
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=cost, reverse=True)  # stable: equal costs keep the collection's order

"""When the runner closes a world it is not using (conformance/frontend/lifetimes.py)."""

from __future__ import annotations

from conformance.frontend.lifetimes import Lifetimes

WS2, WS3, WS4, SIM = (2, False), (3, False), (4, False), (4, True)


def run(lifetimes: Lifetimes, items: list[tuple[str, tuple[int, bool]]]) -> list[list[tuple[int, bool]]]:
    """Play ``items`` in order; after each, the worlds closed. Worlds open as items need them."""
    open_worlds: list[tuple[int, bool]] = []
    closed = []
    for nodeid, key in items:
        if key not in open_worlds:
            open_worlds.append(key)
        lifetimes.used(key)
        shut = lifetimes.to_close(nodeid, open_worlds)
        open_worlds = [k for k in open_worlds if k not in shut]
        closed.append(shut)
    return closed


ITEMS = [("a", WS2), ("b", WS2), ("c", WS3), ("d", WS4), ("e", SIM)]


def test_with_foresight_a_world_closes_after_the_last_item_that_needs_it() -> None:
    lifetimes = Lifetimes(max_idle=1, foresight=True)
    lifetimes.plan(ITEMS)
    assert run(lifetimes, ITEMS) == [[], [WS2], [WS3], [WS4], [SIM]]


def test_without_foresight_only_the_least_recently_used_beyond_the_cap_close() -> None:
    lifetimes = Lifetimes(max_idle=1, foresight=False)
    lifetimes.plan(ITEMS)  # an xdist worker's plan is not the order it runs in
    assert run(lifetimes, ITEMS) == [[], [], [], [WS2], [WS3]]


def test_no_idle_world_kept_at_zero() -> None:
    items = [("a", WS2), ("b", WS3), ("c", WS2)]
    assert run(Lifetimes(max_idle=0, foresight=False), items) == [[], [WS2], [WS3]]


def test_the_world_in_use_is_never_closed_by_the_cap() -> None:
    items = [("a", WS2), ("b", WS2), ("c", WS2)]
    assert run(Lifetimes(max_idle=0, foresight=False), items) == [[], [], []]


def test_an_item_outside_the_plan_closes_nothing_by_foresight() -> None:
    lifetimes = Lifetimes(max_idle=5, foresight=True)
    lifetimes.plan([("a", WS2)])
    assert run(lifetimes, [("replay", WS3)]) == [[]]

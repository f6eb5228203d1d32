"""When the runner closes a world it is not using: an idle world holds every one of its ranks'
RAM (about a GB each on CPU), and a run over several world sizes would otherwise keep
them all until the end."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

WorldKey = tuple[int, bool]  # (processes, simulated)


@dataclasses.dataclass
class Lifetimes:
    """``foresight``: this process runs its planned items in order (no xdist), so a world no
    later item needs is closed at once. ``max_idle``: beyond this many idle worlds, the least
    recently used are closed (the only rule an xdist worker, fed items as it goes, can use)."""

    max_idle: int
    foresight: bool
    _place: dict[str, int] = dataclasses.field(default_factory=dict)  # item -> its place in the run
    _last_need: dict[WorldKey, int] = dataclasses.field(default_factory=dict)  # world -> its last item's place
    _used_at: dict[WorldKey, int] = dataclasses.field(default_factory=dict)  # world -> when last asked for
    _clock: itertools.count = dataclasses.field(default_factory=itertools.count)

    def plan(self, items: Iterable[tuple[str, WorldKey]]) -> None:
        """The items this process will run, in order, each with the world it needs."""
        for place, (nodeid, key) in enumerate(items):
            self._place[nodeid] = place
            self._last_need[key] = place

    def used(self, key: WorldKey) -> None:
        self._used_at[key] = next(self._clock)

    def to_close(self, finished: str, open_worlds: Iterable[WorldKey]) -> list[WorldKey]:
        """The open worlds to close once item ``finished`` is done."""
        place = self._place.get(finished)
        keep = list(open_worlds)
        closing = []
        if self.foresight and place is not None:
            closing = [k for k in keep if self._last_need.get(k, -1) <= place]
            keep = [k for k in keep if k not in closing]
        latest = max(self._used_at, key=self._used_at.__getitem__, default=None)
        idle = sorted((k for k in keep if k != latest), key=lambda k: self._used_at.get(k, -1))
        return closing + idle[: max(len(idle) - self.max_idle, 0)]

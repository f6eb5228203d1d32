"""The rank side of the composition probe: which compositions the Thunder under test offers.

The front end runs it once per session, on a world of the session's size, before it picks
the cells (``conformance.rank.probe:probe_compositions``, named in the task, never imported
by the front end): the covering array is then built over the compositions that run.
"""

from __future__ import annotations

from conformance.rank.build import rank_device
from fixtures.compositions import COMPOSITIONS


def probe_compositions() -> dict[str, str | None]:
    """Composition name -> why the Thunder under test does not offer it, or None where it does."""
    device = rank_device()
    return {name: c.probe(device) if c.probe is not None else None for name, c in COMPOSITIONS.items()}

"""The rank side of the probe: which compositions, offload policies and executors the Thunder
under test (and the environment beside it) offers.

The front end runs it once per session, on a world of the session's size, before it picks
the cells (``conformance.rank.probe:probe_compositions``, named in the task, never imported
by the front end): the covering array is then built over the values that run.
"""

from __future__ import annotations

from conformance.rank.gather import rank_device
from fixtures.compositions import COMPOSITIONS
from fixtures.executors import EXECUTORS
from fixtures.offloads import POLICIES
from transforms import offload


def probe_compositions() -> dict[str, str | None]:
    """Composition, offload policy or executor name -> why the Thunder under test does not
    offer it, or None where it does."""
    device = rank_device()
    found = {name: c.probe(device) if c.probe is not None else None for name, c in COMPOSITIONS.items()}
    offloading = offload.unsupported()
    found.update({name: offloading for name, policy in POLICIES.items() if policy is not None})
    found.update({name: e.probe(device) for name, e in EXECUTORS.items() if e.probe is not None})
    return found

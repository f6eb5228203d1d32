"""The rank side of the probe: which compositions, offload policies and executors the Thunder
under test (and the environment beside it) offers.

The front end runs it once per session, on a world of the session's size, before it picks
the cells (``conformance.rank.probe:probe_compositions``, named in the task, never imported
by the front end): the covering array is then built over the values that run.

A probe answers an absence with its reason (``fixtures/probes.py``); one that raises found
Thunder breaking, not lacking the value. That value counts as offered here, so that its cells
run: each cell's build asks the same probe again (``build.recipe``), and what it raises there
fails the cell with its traceback, blamed on whoever raised it.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

import torch

from conformance.rank.gather import rank_device
from fixtures.compositions import COMPOSITIONS, pair_probes
from fixtures.executors import EXECUTORS
from fixtures.offloads import POLICIES
from transforms import offload


def ask(name: str, probe: Callable[[torch.device], str | None], device: torch.device) -> str | None:
    """The probe's reason, or None where the value is offered or the probe raised (the rank's
    log keeps the traceback; the cells raise it again)."""
    try:
        return probe(device)
    except Exception:  # not an absence: the cells of the value show it, not one stand-in
        print(f"the probe of {name} raised; its cells will run and raise it again:", file=sys.stderr)
        traceback.print_exc()
        return None


def probe_compositions() -> dict[str, str | None]:
    """Composition, offload policy or executor name, or a composition paired with an executors
    value (``pairing``) -> why the Thunder under test does not offer it, or None where it does
    (or where its probe raised)."""
    device = rank_device()
    found = {name: ask(name, c.probe, device) if c.probe is not None else None for name, c in COMPOSITIONS.items()}
    offloading = ask("offloading", lambda _: offload.unsupported(), device)
    found.update({name: offloading for name, policy in POLICIES.items() if policy is not None})
    found.update({name: ask(name, e.probe, device) for name, e in EXECUTORS.items() if e.probe is not None})
    # a composition that cannot run an offered executors value names the pair
    pairs = pair_probes(lambda name: found.get(name) is None)
    found.update({pair: ask(pair, probe, device) for pair, probe in pairs.items()})
    return found

"""Collectives counted at the process group in the kit's own tests of FSDP2's and DDP's
arithmetic (tests/unit/test_fsdp2_collectives.py, test_torch_ddp_collectives.py): a pass of
eager PyTorch counted as the ranks count it, and what was issued and owed, per (phase, kind)."""

from __future__ import annotations

import collections
from typing import Any

import torch

from conformance.checks.fsdp2 import Expected
from conformance.checks.record import Issued


def counted_pass(model: Any, x: torch.Tensor, into: list[Issued], optimizer: Any = None) -> None:
    """A forward and a backward of ``model`` on ``x`` (and, with ``optimizer``, its step and
    zeroed gradients), every collective counted into ``into`` under its phase."""
    from conformance.rank.process_group import counting

    with counting(into, "forward"):
        y = model(x)
    with counting(into, "backward"):
        y.float().sum().backward()
    if optimizer is not None:
        with counting(into, "optimizer step"):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def tallied(calls: list[Issued]) -> dict[tuple[str, str], Expected]:
    """Per (phase, kind): how many ``calls`` issued and their bytes."""
    got: dict[tuple[str, str], Expected] = collections.defaultdict(Expected)
    for c in calls:
        had = got[c.phase, c.kind]
        got[c.phase, c.kind] = Expected(had.count + 1, had.nbytes + c.nbytes)
    return dict(got)


def owed(want: dict[str, dict[str, Expected]]) -> dict[tuple[str, str], Expected]:
    """Per (phase, kind), what a derivation says is issued (kinds with none left out)."""
    return {(phase, kind): e for phase, kinds in want.items() for kind, e in kinds.items() if e.count}

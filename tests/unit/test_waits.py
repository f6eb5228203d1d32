"""The asynchronous collectives Thunder issues outside its traces and never waits on
(conformance/rank/waits.py), and their judgment (collectives.judge_waits)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from conformance.checks.collectives import judge_waits
from conformance.checks.findings import Findings
from conformance.rank.waits import awaited


def test_waited_and_synchronous_collectives_are_not_recorded(world_of_one: None) -> None:
    unwaited: list[str] = []
    t = torch.ones(3)
    with awaited(unwaited, "setup"):
        dist.broadcast(t, src=0)  # synchronous
        dist.all_reduce(t, async_op=True).wait()
        distributed_c10d.broadcast(t, 0, None, True).wait()  # positionally asynchronous
        with distributed_c10d._coalescing_manager(async_ops=True) as cm:
            distributed_c10d.all_reduce(t)
        cm.wait()
    assert unwaited == []


def test_an_asynchronous_collective_never_waited_on_is_recorded(world_of_one: None) -> None:
    unwaited: list[str] = []
    t = torch.ones(3)
    before = (dist.broadcast, distributed_c10d.all_reduce, distributed_c10d._coalescing_manager)
    with awaited(unwaited, "leaving no_sync"):
        dist.broadcast(t, src=0, async_op=True)  # the Work dropped, as a mutant of ddp_v2 does
        with distributed_c10d._coalescing_manager(async_ops=True):  # cm.wait() deleted
            distributed_c10d.all_reduce(t)
    assert unwaited == ["leaving no_sync: broadcast", "leaving no_sync: coalesced collectives"]
    assert (dist.broadcast, distributed_c10d.all_reduce, distributed_c10d._coalescing_manager) == before


def test_a_replacement_of_one_module_binding_is_tracked_and_restored(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted bug (or a user's hook) replaces torch.distributed.all_reduce only: the block
    tracks its asynchronous call through the replacement and hands back both bindings as
    found, so the replacement still runs after Thunder's setup."""
    original, seen = dist.all_reduce, []

    def replaced(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        seen.append(kwargs.get("async_op"))
        return original(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", replaced)
    unwaited: list[str] = []
    with awaited(unwaited, "setup"):
        dist.all_reduce(torch.ones(2), async_op=True)
    assert (seen, unwaited) == ([True], ["setup: all_reduce"])
    assert dist.all_reduce is replaced and distributed_c10d.all_reduce is original


def test_each_collective_never_waited_on_is_a_finding() -> None:
    found = Findings()
    judge_waits(found, ["setup: broadcast", "leaving no_sync: coalesced collectives"])
    assert [(f.code, f.fields) for f in found.found] == [
        ("collectives.unwaited", {"phase": "setup", "call": "broadcast"}),
        ("collectives.unwaited", {"phase": "leaving no_sync", "call": "coalesced collectives"}),
    ]
    judge_waits(clean := Findings(), [])
    assert clean.found == []

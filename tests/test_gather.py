"""The kit's gather never crashes on what Thunder left (conformance/rank/gather.py): a
parameter never materialized, still on the meta device, gathers as NaN of its full shape, so
that the ranks issue the same collectives and every comparison of its values fails naming it
(the materialization area names the meta device). In a world of one gloo rank, in process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conformance.rank.gather import gather


@pytest.fixture
def world_of_one(tmp_path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("replicated", [True, False], ids=["ddp", "fsdp"])
def test_a_parameter_left_on_meta_gathers_as_nan(world_of_one: None, replicated: bool) -> None:
    module = nn.Linear(3, 2)
    module.weight = nn.Parameter(torch.empty(2, 3, device="meta"))
    shapes = {"weight": torch.Size([2, 3]), "bias": torch.Size([2])}
    out = gather(module, shapes, replicated=replicated)
    assert out["weight"].shape == (2, 3) and out["weight"].isnan().all()
    assert torch.equal(out["bias"], module.bias.detach())
    # its gradient, which no rank can have, is left out as a frozen parameter's is
    module.bias.grad = torch.ones(2)
    grads = gather(module, shapes, grads=True, replicated=replicated)
    assert set(grads) == {"bias"} and torch.equal(grads["bias"], torch.ones(2))

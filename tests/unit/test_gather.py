"""The kit's gather never crashes on what Thunder left (conformance/rank/gather.py): a
parameter never materialized (still on the meta device), a shard of the wrong shape or dtype
(and its gradient), gathers as NaN where that rank's part goes, so that the ranks issue the same
collectives, and every comparison of its values fails naming what was wrong. In a world of
one gloo rank, in process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conformance.checks.findings import Findings
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
    assert out.defects == {"weight": "rank 0: still on the meta device"}
    assert torch.equal(out["bias"], module.bias.detach())
    # its gradient, which no rank can have, is left out as a frozen parameter's is
    module.bias.grad = torch.ones(2)
    grads = gather(module, shapes, grads=True, replicated=replicated)
    assert set(grads) == {"bias"} and torch.equal(grads["bias"], torch.ones(2))


@pytest.mark.parametrize("replicated", [True, False], ids=["ddp", "fsdp"])
@pytest.mark.parametrize(
    ("held", "named"),
    [
        (torch.ones(3, 2), "shape (3, 2), expected (2, 3)"),
        (torch.ones(2, 3, dtype=torch.float64), "dtype torch.float64, expected torch.float32"),
        (torch.ones(6), "shape (6,), expected (2, 3)"),
    ],
    ids=["transposed", "float64", "flat"],
)
def test_a_parameter_thunder_got_wrong_is_a_finding_not_a_crash(
    world_of_one: None, replicated: bool, held: torch.Tensor, named: str
) -> None:
    # autograd gives a gradient the shape and dtype of its parameter: a shard cut wrong (or
    # one held in the wrong dtype) is wrong in both
    module = nn.Linear(3, 2)
    module.weight = nn.Parameter(held)
    module.weight.grad, module.bias.grad = torch.ones_like(held), torch.ones(2)
    shapes = {"weight": torch.Size([2, 3]), "bias": torch.Size([2])}
    dtypes = {"weight": torch.float32, "bias": torch.float32}
    for grads in (False, True):
        out = gather(module, shapes, grads=grads, replicated=replicated, dtypes=dtypes)
        assert out["weight"].shape == (2, 3) and out["weight"].dtype == torch.float32
        assert out["weight"].isnan().all()
        assert out.defects == {"weight": f"rank 0: {named}"}
        found = Findings()
        expected = {"weight": torch.ones(2, 3), "bias": out["bias"]}
        assert not found.close(
            "numerics.tensor", "gradients at step 0", out, expected, fields={"quantity": "gradients"}
        )
        [failure] = found.found
        assert (failure.code, failure.fields) == (
            "numerics.tensor",
            {"quantity": "gradients", "name": "weight", "problem": "not gathered"},
        )
        assert failure.message == f"gradients at step 0 [weight]: not gathered as Thunder held it: rank 0: {named}"


def test_a_tensor_left_on_meta_copies_as_values_no_comparison_takes_for_eagers() -> None:
    """Thunder left a buffer unmaterialized: the rank side records it (the materialization area
    names the device) instead of crashing in the copy ('Cannot copy out of meta tensor')."""
    from conformance.rank.gather import cpu_copies

    copies = cpu_copies(
        [
            ("running_mean", torch.empty(3, device="meta")),
            ("num_batches_tracked", torch.empty((), dtype=torch.long, device="meta")),
            ("mask", torch.empty(2, dtype=torch.bool, device="meta")),
        ]
    )
    assert copies["running_mean"].device.type == "cpu" and copies["running_mean"].isnan().all()
    assert copies["num_batches_tracked"].item() == torch.iinfo(torch.long).min
    assert copies["mask"].shape == (2,) and copies["mask"].dtype == torch.bool

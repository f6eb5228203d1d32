"""The kit's gather never crashes on what Thunder left (conformance/rank/gather.py): a
parameter never materialized (still on the meta device), a shard of the wrong shape or dtype
(and its gradient), gathers as NaN where that rank's part goes, so that the ranks issue the same
collectives, and every comparison of its values fails naming what was wrong. In a world of
one gloo rank, in process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conformance.checks.findings import Findings
from conformance.rank.gather import gather


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


def _gather_dtensors(rank: int, store: str, out: str, on_both: bool) -> None:
    """One rank of a world of two: ``weight`` a DTensor on rank 0 and, unless ``on_both``, a
    plain tensor of the same rows on rank 1; the gathered result written to ``out``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        rows = torch.full((2, 3), float(rank))  # rank r holds rows 2r and 2r+1 of a (4, 3) weight
        module = nn.Module()
        held = DTensor.from_local(rows, mesh, [Shard(0)], run_check=False) if rank == 0 or on_both else rows
        module.weight = nn.Parameter(held)
        got = gather(module, {"weight": torch.Size([4, 3])}, dtensors=True)
        torch.save({"weight": got["weight"], "defects": got.defects}, f"{out}.{rank}")
        # neither rank tears its pairs down while the other's gloo thread still sends: one
        # run in five aborted a rank ("terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("on_both", [True, False], ids=["every-rank", "one-rank"])
def test_a_dtensor_on_some_ranks_only_is_a_defect_not_a_hang(tmp_path, on_both: bool) -> None:
    """FSDP2's DTensors are gathered by DTensor's own collective, the kit's shards by the kit's:
    where Thunder left a DTensor on one rank only, the ranks agree to gather it as NaN, naming
    what each held, instead of issuing different collectives until the cell's timeout."""
    import torch.multiprocessing as mp

    out = tmp_path / "gathered"
    mp.spawn(_gather_dtensors, args=(str(tmp_path / "store"), str(out), on_both), nprocs=2, join=True)
    results = [torch.load(f"{out}.{r}") for r in range(2)]
    for got in results:
        if on_both:
            assert torch.equal(got["weight"], torch.tensor([[0.0] * 3] * 2 + [[1.0] * 3] * 2))
            assert got["defects"] == {}
        else:
            assert got["weight"].shape == (4, 3) and got["weight"].isnan().all()
            assert got["defects"] == {
                "weight": "rank 0: a DTensor, where 1 of 2 ranks hold a DTensor; "
                "rank 1: a plain tensor, where 1 of 2 ranks hold a DTensor"
            }

"""FSDP2's arithmetic (conformance/checks/fsdp2.py) against FSDP2 itself: eager PyTorch, no
Thunder, sharded as the kit's compositions shard it, counted at the process group as the ranks
count (conformance/rank/process_group.py). Units, padding at a world size that divides no
first dimension, a tied weight, frozen parameters, ZERO2 and ZERO3, mixed precision (bfloat16
gathers, float32 reduce-scatters): each phase's count and bytes of every kind equal the derived
ones."""

from __future__ import annotations

import types

import pytest
import torch

from conformance.checks import collectives, fsdp2
from conformance.checks.record import Issued
from fixtures.models import fixture_for
from fixtures.options import MICRO_STEPS, MIXED
from fixtures.torch_parallel import BLOCKS_WRAP, ROOT_WRAP
from tests.support.issued import counted_pass, owed, tallied

# world size -> the cases one world runs in turn: (model, tied, sharding, dtype, FSDP2's wrap)
pytestmark = pytest.mark.slow  # spawns worlds of 2, 3 and 4 ranks

CASES = {
    # blocks and the root, the tied embedding the root's; the root alone (3 divides no first dimension)
    # and a model with blocks sharded at its root alone
    3: [
        ("litgpt_llama", True, "zero3", "float32", BLOCKS_WRAP),
        ("tied_lm", True, "zero3", "float32", BLOCKS_WRAP),
        ("litgpt_llama", False, "zero3", "float32", ROOT_WRAP),
    ],
    # frozen parameters: gathered, never reduced; FSDP2's mixed precision
    2: [
        ("litgpt_llama", False, "zero2", "float32", BLOCKS_WRAP),
        ("lora", False, "zero2", "float32", BLOCKS_WRAP),
        ("litgpt_llama", True, "zero3", "mixed_bfloat16", BLOCKS_WRAP),
        ("litgpt_llama", True, "zero2", "mixed_bfloat16", ROOT_WRAP),
    ],
    # 4 divides none of litgpt_llama's vocabulary rows (37): padded shards at 4 ranks too
    4: [("litgpt_llama", False, "zero2", "mixed_bfloat16", BLOCKS_WRAP)],
}


def _model(name: str, tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return fixture_for(name).build(tied)


def _train_one_step(rank: int, world: int, store: str, out: str) -> None:
    """Each case of the world: one step of eager FSDP2, then each scenario as its cell runs it
    after training (reshape, accumulate, then infer: a no_grad forward under ZERO2 leaves the
    units gathered), every collective counted."""
    import torch.distributed as dist

    from conformance.rank.process_group import counted_group, counting
    from fixtures.torch_parallel import _fully_shard

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        group = counted_group()
        issued = []
        for name, tied, sharding, dtype, wrap in CASES[world]:
            reshard, mixed = sharding == "zero3", MIXED.get(dtype)
            how = types.SimpleNamespace(
                device=torch.device("cpu"), process_group=group, fsdp2_reshard=reshard, fsdp2_mixed=mixed
            )
            model, _ = _fully_shard(_model(name, tied), how, wrap)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            x = fixture_for(name).make_input(torch.Generator().manual_seed(rank), torch.float32)
            calls: list[Issued] = []
            counted_pass(model, x, calls, optimizer)
            # the scenarios, each as its cell runs it after training: reshape's step at the
            # second input shape (it leaves every unit resharded), then infer's no_grad forward
            reshaped: list[Issued] = []
            second = fixture_for(name).second_input(torch.Generator().manual_seed(rank), torch.float32)
            counted_pass(model, second, reshaped)
            optimizer.zero_grad(set_to_none=True)
            accumulated: list[Issued] = []
            for micro in range(MICRO_STEPS):
                model.set_requires_gradient_sync(micro == MICRO_STEPS - 1)  # the last syncs
                counted_pass(model, x, accumulated)
            inferred: list[Issued] = []
            with torch.no_grad(), counting(inferred, "forward"):
                model(x)
            issued.append((calls, {"reshape": reshaped, "accumulate": accumulated, "infer": inferred}))
        torch.save(issued, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", sorted(CASES), ids=lambda w: f"ws{w}")
def test_derived_counts_and_bytes_are_what_fsdp2_issues(tmp_path, world: int) -> None:
    import torch.multiprocessing as mp

    out = tmp_path / "issued"
    mp.spawn(_train_one_step, args=(world, str(tmp_path / "store"), str(out)), nprocs=world, join=True)
    for rank in range(world):
        issued = torch.load(f"{out}.{rank}", weights_only=False)
        for (name, tied, sharding, dtype, wrap), (calls, scenarios) in zip(CASES[world], issued, strict=True):
            want = fsdp2.expected(_model(name, tied), sharding, world, MIXED.get(dtype), wrap)
            assert tallied(calls) == owed(want), f"{name} {sharding}, rank {rank}"
            # each scenario as the collectives area derives it from a training step's numbers
            for scenario, scenario_calls in scenarios.items():
                wanted = owed(collectives.scenario_wanted(scenario, want))
                assert tallied(scenario_calls) == wanted, f"{scenario}: {name} {sharding}, rank {rank}"
            # the model is what the cases say: two blocks and the root, or the root alone
            assert want["forward"]["all_gather"].count == (3 if name == "litgpt_llama" and wrap == BLOCKS_WRAP else 1)


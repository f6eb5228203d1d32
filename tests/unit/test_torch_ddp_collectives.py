"""DDP's collectives (conformance/checks/torch_ddp.py) against DDP itself: eager PyTorch, no
Thunder, composed as the kit's compositions compose it, counted on the counting group as the
ranks count (conformance/rank/process_group.py): the reducer's all-reduces, its buffer
broadcasts and its bucket rebuild, all in C++. A tied weight, frozen parameters, bfloat16,
buffers of two dtypes, a model past DDP's first-bucket cap: each step's and each scenario's
count and bytes equal the derived ones."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from conformance.checks import collectives, torch_ddp
from conformance.checks.record import Issued
from fixtures.models import fixture_for
from fixtures.options import MICRO_STEPS
from tests.support.issued import counted_pass, owed, tallied

pytestmark = pytest.mark.slow  # spawns a world of 2 ranks

WORLD = 2
STEPS = 3
# (model, tied, dtype): a tie, blocks in bfloat16 (float32 RoPE buffers), frozen parameters,
# a BatchNorm's float32 and int64 buffers; and three wide layers, whose gradients pass DDP's
# 1 MiB first bucket once DDP rebuilds its buckets
CASES = [
    ("tied_lm", True, torch.float32),
    ("root_owned", False, torch.float32),
    ("litgpt_llama", False, torch.bfloat16),
    ("lora", False, torch.float32),
    ("wide", False, torch.float32),
]


def _model(name: str, tied: bool, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "wide":  # three 512 x 512 layers: 3 MiB of float32 gradients
        return torch.nn.Sequential(*(torch.nn.Linear(512, 512) for _ in range(3)))
    return fixture_for(name).build(tied).to(dtype)


def _input(name: str, rank: int, dtype: torch.dtype) -> torch.Tensor:
    if name == "wide":
        return torch.randn(4, 512, generator=torch.Generator().manual_seed(rank))
    return fixture_for(name).make_input(torch.Generator().manual_seed(rank), dtype)


def _train(rank: int, store: str, out: str) -> None:
    """Each case: STEPS training steps of eager DDP, then accumulate's micro-steps and infer's
    no_grad forward, every collective counted."""
    import torch.distributed as dist

    from conformance.rank.process_group import counted_group, counting
    from fixtures.torch_parallel import _ddp

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        group = counted_group()
        issued = []
        for name, tied, dtype in CASES:
            model = _ddp(_model(name, tied, dtype), types.SimpleNamespace(torch_ddp_options={}, process_group=group))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            x = _input(name, rank, dtype)
            steps: list[list[Issued]] = [[] for _ in range(STEPS)]
            for calls in steps:
                counted_pass(model, x, calls, optimizer)
            accumulated: list[Issued] = []
            for micro in range(MICRO_STEPS):
                synced = micro == MICRO_STEPS - 1
                with model.no_sync() if not synced else contextlib.nullcontext():
                    counted_pass(model, x, accumulated)
            inferred: list[Issued] = []
            with torch.no_grad(), counting(inferred, "forward"):
                model(x)
            issued.append((steps, {"accumulate": accumulated, "infer": inferred}))
        torch.save(issued, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_derived_counts_and_bytes_are_what_ddp_issues(tmp_path) -> None:
    import torch.multiprocessing as mp

    out = tmp_path / "issued"
    mp.spawn(_train, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        issued = torch.load(f"{out}.{rank}", weights_only=False)
        for (name, tied, dtype), (steps, scenarios) in zip(CASES, issued, strict=True):
            model = _model(name, tied, dtype)
            for k, calls in enumerate(steps):
                assert tallied(calls) == owed(torch_ddp.expected(model, k)), f"{name} step {k}, rank {rank}"
            for scenario, scenario_calls in scenarios.items():
                wanted = owed(collectives.scenario_wanted(scenario, torch_ddp.expected(model, STEPS)))
                assert tallied(scenario_calls) == wanted, f"{scenario}: {name}, rank {rank}"
    # the cases are what they say: one bucket until DDP rebuilds them, then the wide model's
    # past the first bucket's cap; lora's frozen parameters in none; root_owned's buffers in
    # two broadcasts, one per dtype
    assert len(torch_ddp.buffer_broadcasts(_model("root_owned", False, torch.float32))) == 2
    wide = _model("wide", False, torch.float32)
    assert (len(torch_ddp.reducer_buckets(wide, 0)), len(torch_ddp.reducer_buckets(wide, 1))) == (1, 2)
    lora = _model("lora", False, torch.float32)
    trainable = sum(p.numel() * 4 for p in lora.parameters() if p.requires_grad)
    assert trainable < sum(p.numel() * 4 for p in lora.parameters())
    assert torch_ddp.reducer_buckets(lora, 1) == [trainable]

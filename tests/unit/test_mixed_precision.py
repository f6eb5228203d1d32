"""The eager reference of FSDP2's mixed precision (conformance/rank/mixed.py) against FSDP2
itself: eager PyTorch, no Thunder. At 2 ranks, each fed the same input, FSDP2's averaged
gradient is every rank's own, so the reference's forward and backward on that input must
equal FSDP2's bit for bit: bfloat16 gathers and compute, a tie's gradient accumulated in
bfloat16, gradients cast up to float32 before the reduce-scatter; the units as either wrap makes
them (a root alone casts no block's inputs)."""

from __future__ import annotations

import copy
import types

import pytest
import torch

from fixtures.models import fixture_for
from fixtures.options import MIXED
from fixtures.torch_parallel import BLOCKS_WRAP, ROOT_WRAP

pytestmark = pytest.mark.slow  # spawns a world of 2 ranks

WORLD = 2
# (model, tied, FSDP2's wrap: fixtures/torch_parallel.py)
CASES = [
    ("tied_lm", True, BLOCKS_WRAP),
    ("litgpt_llama", True, BLOCKS_WRAP),
    ("litgpt_llama", False, ROOT_WRAP),
    ("mlp", False, BLOCKS_WRAP),
]


def _model(name: str, tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return fixture_for(name).build(tied)


def _step(rank: int, store: str, out: str) -> None:
    """Each case: one forward and backward of FSDP2 under the mixed policy and of the eager
    reference, on the same input; rank 0 saves both sides' output and full gradients."""
    import torch.distributed as dist

    from conformance.rank.mixed import mixed
    from fixtures.torch_parallel import _fully_shard

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        sides = []
        for name, tied, wrap in CASES:
            model = _model(name, tied)
            reference = mixed(copy.deepcopy(model), torch.bfloat16, wrap)
            how = types.SimpleNamespace(
                device=torch.device("cpu"), process_group=None, fsdp2_reshard=True, fsdp2_mixed=MIXED["mixed_bfloat16"]
            )
            sharded, _ = _fully_shard(model, how, wrap)
            x = fixture_for(name).make_input(torch.Generator().manual_seed(0), torch.float32)
            outs = []
            for module in (sharded, reference):
                y = module(x)
                cotangent = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.dtype)
                (y * cotangent).sum().backward()
                grads = {
                    n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                    for n, p in module.named_parameters()
                }
                outs.append((y.detach().clone(), grads))
            sides.append(outs)
        if rank == 0:
            torch.save(sides, out)
    finally:
        dist.destroy_process_group()


def test_the_reference_computes_as_fsdp2_mixed_precision_does(tmp_path) -> None:
    import torch.multiprocessing as mp

    out = tmp_path / "sides"
    mp.spawn(_step, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD, join=True)
    for (name, *_), ((y, grads), (y_ref, grads_ref)) in zip(CASES, torch.load(out, weights_only=False), strict=True):
        assert y.dtype == y_ref.dtype == torch.bfloat16, name
        assert torch.equal(y, y_ref), name
        assert grads.keys() == grads_ref.keys(), name
        for n in grads:
            assert grads[n].dtype == grads_ref[n].dtype == torch.float32, (name, n)
            assert torch.equal(grads[n], grads_ref[n]), (name, n, (grads[n] - grads_ref[n]).abs().max())


def test_the_twin_computes_in_float32_again() -> None:
    from conformance.rank.mixed import float32_twin, mixed

    model = mixed(_model("mlp", False), torch.bfloat16, BLOCKS_WRAP)
    twin = float32_twin(model, torch.bfloat16)
    x = torch.randn(4, 12)
    assert model(x).dtype == torch.bfloat16 and twin(x).dtype == torch.float32
    assert float32_twin(model, torch.float32) is None

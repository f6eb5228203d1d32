"""The checkpointing axis: what the fixture does to a model, which cells may carry it, and the
copies of a batched matmul that the memory area's walk allows (what a checkpointed backward
showed at its peak)."""

from __future__ import annotations

import pytest
import torch

from conformance.matrix.axes import valid
from fixtures.checkpointing import BLOCKS, NONE, checkpointed, numbered_blocks
from fixtures.models import MODELS


def _saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """What autograd saves for the model's backward (activations: parameters left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    return sum(saved.values()), out


def test_checkpointed_blocks_keep_names_values_and_gradients_and_save_less() -> None:
    fixture = MODELS["litgpt_llama"]
    x = fixture.make_input(torch.Generator().manual_seed(0), torch.float32)
    torch.manual_seed(0)
    plain = fixture.build(False)
    torch.manual_seed(0)
    model = checkpointed(fixture.build(False), BLOCKS)
    assert list(model.state_dict()) == list(plain.state_dict())
    plain_saved, plain_out = _saved_bytes(plain, x)
    saved, out = _saved_bytes(model, x)
    torch.testing.assert_close(out, plain_out, rtol=0, atol=0)
    out.sum().backward()
    plain_out.sum().backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert saved < plain_saved / 2, (saved, plain_saved)  # the blocks' inputs, not their activations


def test_a_model_without_blocks_cannot_be_checkpointed() -> None:
    model = MODELS["mlp"].build(False)
    assert numbered_blocks(model) == []
    assert checkpointed(model, NONE) is model
    with pytest.raises(ValueError, match="no numbered blocks"):
        checkpointed(model, BLOCKS)
    with pytest.raises(ValueError, match="checkpointing is one of"):
        checkpointed(MODELS["litgpt_llama"].build(False), "selective")


def test_only_models_with_blocks_that_offload_nothing_are_checkpointed() -> None:
    row = {"model": "litgpt_neox", "composition": "jit_fsdp", "checkpointing": BLOCKS}
    assert valid(row) and valid({**row, "composition": "thunderfx_fsdp2"})
    assert not valid({**row, "model": "mlp"})
    assert not valid({**row, "offload": "all"})
    assert valid({**row, "model": "mlp", "checkpointing": NONE})


def test_the_walk_allows_what_a_batched_matmul_copies_of_an_operand_that_views_another() -> None:
    """q and k split out of one projection, then q @ k^T: aten's matmul copies both before its
    bmm, and the runtime peaks that much over a walk that counts only the product."""
    import thunder

    from conformance.checks.memory import liveness
    from conformance.rank.measure import measure

    def attention_scores(qkv: torch.Tensor) -> torch.Tensor:
        q, k = qkv.view(2, 8, 4, 12).permute(0, 2, 1, 3).split(6, dim=-1)
        return q @ k.transpose(-2, -1)

    jitted = thunder.jit(attention_scores)
    qkv = torch.randn(2, 8, 48)
    jitted(qkv)
    cpu = torch.device("cpu")
    with measure(cpu) as reading:
        jitted(qkv)
    trace = thunder.last_traces(jitted)[-1]
    assert reading.peak == liveness.walk(trace, cpu).peak
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(liveness, "_FOLDING", set())
        assert liveness.walk(trace, cpu).peak < reading.peak  # the copies the walk must allow

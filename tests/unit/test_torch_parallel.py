"""PyTorch's parallelism under Thunder, without a world: the names a rank reads the model
by (eager's, a ThunderModule's own component dropped), FSDP2's units, and what a jitted
module's parameters are to the kit (the tensors registered in the model, never the
ThunderModule's snapshot of them)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fixtures.models import MODELS
from fixtures.torch_parallel import BLOCKS_WRAP, ROOT_WRAP, UnderTest, eager_name, units


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(3, 4)
        self.h = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.head = nn.Linear(4, 2)
        self.head.weight = nn.Parameter(torch.ones(2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.emb(x)
        for block in self.h:
            x = block(x)
        return self.head(x)


def test_a_jitted_block_is_read_by_eager_names() -> None:
    import thunder

    model = Blocks()
    eager = [n for n, _ in model.named_parameters()]
    model.h[0] = thunder.jit(model.h[0])
    registered = [n for n, _ in nn.Module.named_parameters(model)]
    assert "h.0._model.weight" in registered  # as nn.Module, and FSDP2, see it
    assert [eager_name(model, n) for n in registered] == eager
    under = UnderTest(model, model)
    assert [n for n, _ in under.named_parameters()] == eager
    # the tensors registered in the model: the ones FSDP2 would replace by its shards
    assert under.get_parameter("h.0.weight") is model.h[0]._model.weight


def test_a_tied_weight_is_found_by_each_of_its_names() -> None:
    model = MODELS["tied_lm"].build(True)
    under = UnderTest(model, model)
    tied = [n for n, p in model.named_parameters(remove_duplicate=False) if p is model.get_parameter(n)]
    names = {n for n, _ in under.named_parameters()}
    every = {n for n, _ in under.named_parameters(remove_duplicate=False)}
    assert names < every  # the optimizer steps a tied weight once
    assert all(under.get_parameter(n) is model.get_parameter(n) for n in tied)


def test_fsdp2_units_are_the_numbered_blocks_then_the_root_or_the_root_alone() -> None:
    model = Blocks()
    assert units(model, BLOCKS_WRAP) == [model.h[0], model.h[1], model]
    assert units(model, ROOT_WRAP) == [model]
    plain = MODELS["mlp"].build(False)
    assert units(plain, BLOCKS_WRAP) == units(plain, ROOT_WRAP) == [plain]
    with pytest.raises(ValueError, match="wrapped by"):
        units(model, "leaves")


def test_meta_init_materializes_every_tensor_as_eager_builds_it() -> None:
    """Lightning's meta init (``to_empty``, then each module's ``reset_parameters``), without a
    world: nothing left on meta, every value finite, the tie kept, and litgpt's RoPE cache (which
    its root's reset recomputes in float32) equal to eager's in the model's bfloat16."""
    from fixtures.torch_parallel import materialize

    for name in ("tied_lm", "litgpt_llama"):
        eager = MODELS[name].build(True).to(torch.bfloat16)
        with torch.device("meta"):
            model = MODELS[name].build(True).to(torch.bfloat16)
        materialize(model, torch.device("cpu"))
        tensors = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
        assert all(t.device.type == "cpu" and bool(t.isfinite().all()) for t in tensors.values()), name
        assert {n: b.dtype for n, b in model.named_buffers()} == {n: b.dtype for n, b in eager.named_buffers()}
        for n, b in eager.named_buffers():
            torch.testing.assert_close(model.get_buffer(n), b, rtol=0, atol=0)
        first = {id(p): n for n, p in eager.named_parameters()}
        ties = {n: first[id(p)] for n, p in eager.named_parameters(remove_duplicate=False) if first[id(p)] != n}
        assert ties, name  # both models offer the tie
        for alias, owner in ties.items():
            assert model.get_parameter(alias) is model.get_parameter(owner)

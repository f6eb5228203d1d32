"""Setup's peak under meta init along Thunder's materialization path
(conformance/checks/memory/setup_path.py), by hand on the kit's mlp (fc1: 20x12, fc2: 7x20, float32)
from eager's own readings (conformance/rank/module_init.py), and on hand-made models for the
paths mlp does not take: ties, a buffer the reset replaces, a module without reset_parameters."""

from __future__ import annotations

import torch
from torch import nn

from conformance.checks.memory.setup_path import setup_path
from conformance.checks.record import ModuleInit
from conformance.rank.module_init import module_inits
from fixtures.toy_models import MLP

CPU = torch.device("cpu")
MLP_RESIDENT = 856  # fc1 (480 + 40) and fc2 (8 padded rows: 320 + 16) halves at 2 ranks


def _path(model: nn.Module, inits: list[ModuleInit], materialize: str = "module", world: int | None = 2, **kw):
    handed = kw.pop("handed_over", None if materialize == "module" else materialize)
    return setup_path(
        model,
        inits,
        materialize=materialize,
        handed_over=handed,
        resident=kw.pop("resident", 0),
        world=world,
        device=CPU,
    )


def test_eager_reads_each_module_initialized_on_its_own() -> None:
    inits = module_inits(MLP, torch.float32, CPU, non_persistent_only=False)
    # the root owns nothing; each Linear's reset fills its tensors in place
    assert [(i.name, i.peak, i.kept, i.replaced) for i in inits] == [("fc1", 1040, 1040, {}), ("fc2", 588, 588, {})]
    assert module_inits(MLP, torch.float32, CPU, non_persistent_only=True) == []


def test_fsdp_module_init_holds_the_previous_module_beside_the_next() -> None:
    path = _path(MLP(), module_inits(MLP, torch.float32, CPU, False), resident=MLP_RESIDENT)
    # fc1: 1040; its cut: 1040 + shards 480 + 40. fc2's init beside fc1 (the loop's state dict
    # still holds it): 1040 + 588, the peak; fc2's cut: 588 + padded copy 640 + shard 320
    assert (path.resident, path.materialization, path.loading, path.lingering) == (856, 1628, 0, 0)
    assert path.peak == 2484  # what the pin's setup measures for this cell, to the byte


def test_ddp_cuts_nothing_and_an_original_state_dict_is_cut_as_it_loads() -> None:
    inits = module_inits(MLP, torch.float32, CPU, False)
    assert _path(MLP(), inits, world=None).materialization == 1040 + 588
    # from the unsharded state dict: fc2's weight padded to 8 rows (640) and its shard (320)
    loaded = _path(MLP(), [], materialize="original")
    assert (loaded.materialization, loaded.loading) == (0, 640 + 320)
    assert _path(MLP(), [], materialize="original", world=None).loading == 0
    # a sharded state dict is copied into the shards in place
    assert _path(MLP(), [], materialize="transformed").peak == 0


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight


def test_a_module_of_tied_tensors_only_is_not_made_and_frees_the_previous() -> None:
    inits = module_inits(Tied, torch.float32, CPU, False)
    path = _path(Tied(), inits, world=None)
    assert path.materialization == 64  # a alone; b's weight is a's, nothing is made for it


class Rotary(nn.Module):
    """A root that owns a non-persistent cache its reset rebuilds in float32 whatever the
    model's dtype (as litgpt's rope cache), beside a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4, bias=False)
        self.register_buffer("cache", torch.zeros(8), persistent=False)

    def reset_parameters(self) -> None:
        self.cache = torch.arange(8, dtype=torch.float32, device=self.cache.device)


def test_a_replaced_buffer_is_converted_back_and_may_linger() -> None:
    inits = module_inits(lambda: Rotary(), torch.bfloat16, CPU, True)
    assert [(i.name, i.replaced) for i in inits] == [("", {"cache": 32})]
    path = _path(Rotary().to(torch.bfloat16), inits, materialize="transformed")
    # to_empty (16 in bfloat16) and the reset's float32 cache (32); then the reset one kept
    # (32) beside its bfloat16 conversion (16); either may stay alive after
    assert (path.materialization, path.lingering) == (16 + 32, 32)


class NoReset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))


def test_a_module_eager_cannot_initialize_is_named() -> None:
    inits = module_inits(NoReset, torch.float32, CPU, False)
    assert inits == [ModuleInit("", peak=None, kept=None)]
    assert _path(NoReset(), inits).missing == "the root module"

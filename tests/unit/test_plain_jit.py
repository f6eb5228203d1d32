"""Plain jit's plan (conformance/rank/plain_jit.py): rank 0 compiles it once per key and hands it to
the world; a Thunder patched in for a block (the kit's planted bugs, in worlds that outlive
the patch) neither takes the installed Thunder's plans nor leaves its own behind."""

from __future__ import annotations

import tempfile
import types
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from conformance.checks.record import PlainPlan
from conformance.rank import plain_jit


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str | None]]:
    """Which Thunder each compile ran under, in a world of one gloo rank, with no compile."""
    made: list[str | None] = []

    def compile_(recipe: object) -> PlainPlan:
        made.append(plain_jit._VARIANT)
        return PlainPlan(returned=len(made))

    monkeypatch.setattr(plain_jit, "_compile", compile_)
    monkeypatch.setattr(plain_jit, "_PLANS", {})
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
    try:
        yield made
    finally:
        dist.destroy_process_group()


def _recipe(model: str = "mlp", checkpointing: str = "none") -> object:
    cell = types.SimpleNamespace(
        model=model, spec=None, tie="untied", checkpointing=checkpointing, dtype="float32", executors="default"
    )
    return types.SimpleNamespace(cell=cell, device=torch.device("cpu"))


def test_a_plan_is_compiled_once_per_key_and_per_thunder(compiles: list[str | None]) -> None:
    first = plain_jit.plain_plan(_recipe())
    assert plain_jit.plain_plan(_recipe()) == first and compiles == [None]
    with plain_jit.variant("a_planted_bug"):
        planted = plain_jit.plain_plan(_recipe())
        assert plain_jit.plain_plan(_recipe()) == planted
    assert planted != first and compiles == [None, "a_planted_bug"]
    assert plain_jit.plain_plan(_recipe()) == first  # the installed Thunder's again, not the bug's
    plain_jit.plain_plan(_recipe("tied_lm"))
    assert compiles == [None, "a_planted_bug", None]


def test_a_checkpointed_model_has_a_plan_of_its_own(compiles: list[str | None]) -> None:
    """Blocks through torch.utils.checkpoint save their inputs alone: the checkpointed model's
    plan is never the plain one's, in either order (a census trial's order put the checkpointed
    cell first and the plain cell's memory item failed against it)."""
    checkpointed = plain_jit.plain_plan(_recipe(checkpointing="blocks"))
    assert plain_jit.plain_plan(_recipe()) != checkpointed and len(compiles) == 2


def test_plain_jit_raising_is_a_plan_that_says_so(compiles: list[str | None], monkeypatch) -> None:
    def raising(recipe: object) -> PlainPlan:
        raise RuntimeError("plain jit cannot trace this model")

    monkeypatch.setattr(plain_jit, "_compile", raising)
    assert plain_jit.plain_plan(_recipe()).error == "RuntimeError: plain jit cannot trace this model"

"""Bugs planted in Thunder's DTensor support, caught on tensor parallelism's cells. On the pin
ThunderFX hands Thunder the DTensor ops between a plan's Linears (LLaMA's gate: silu and mul of
two column-wise outputs) and splits the Linears off; a bug in those ops shows there alone."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.planted.cells import Pred
from tests.planted.record import Expect, planted

TENSOR_PARALLEL: Pred = lambda cell: cell.composition == "thunderfx_tp"  # noqa: E731
# DTensor ops reach Thunder where the plan's column-wise outputs meet: LLaMA's gated MLP
GATED: Pred = lambda cell: TENSOR_PARALLEL(cell) and cell.model == "litgpt_llama"  # noqa: E731
UNGATED: Pred = lambda cell: TENSOR_PARALLEL(cell) and cell.model == "mlp"  # noqa: E731


@planted(
    {
        "numerics": Expect(GATED, words="output against eager's whole model"),
        "collectives": Expect(GATED, words="forward all_gathers: expected 0"),
    },
    cells=(GATED, UNGATED),
    parallelisms=frozenset({"tensor"}),
)
@contextlib.contextmanager
def gated_product_reads_the_first_shard() -> Iterator[None]:
    """Thunder's DTensor multiply gathers its second operand (a column-wise Linear's output,
    split on the last dim) and cuts every rank's piece from the front: each rank multiplies its
    own gate by rank 0's features. Rank 0 computes right, every other rank silently wrong, and
    the forward issues an all-gather the plan never asks for."""
    from torch.distributed.tensor import DTensor

    def first_shard(original: Mul) -> Mul:
        def mul(a: Any, b: Any) -> Any:
            if not (isinstance(a, DTensor) and isinstance(b, DTensor)):
                return original(a, b)
            held = b.to_local().shape[-1]
            front = b.full_tensor()[..., :held]
            return original(a, DTensor.from_local(front, b.device_mesh, b.placements, shape=b.shape, stride=b.stride()))

        return mul

    with _mul_replaced(first_shard):
        yield


@planted(
    {"collectives": Expect(GATED, words="forward all_gathers: expected 0 | forward all_to_alls: expected 0")},
    cells=(GATED, UNGATED),
    parallelisms=frozenset({"tensor"}),
)
@contextlib.contextmanager
def product_gathered_on_the_wrong_dim() -> Iterator[None]:
    """Thunder's DTensor multiply hands back its product laid out on dim 0 (``Shard(0)``)
    where its operands were split on the last dim, as a plan whose column-wise output is
    gathered and re-split on the wrong dim: the values are right, so the row-wise Linear
    after it computes what it should, but only once DTensor has moved the product back
    (collectives the plan never asks for). Numerics cannot see it; the collectives must."""
    from torch.distributed.tensor import DTensor, Shard

    def wrong_dim(original: Mul) -> Mul:
        def mul(a: Any, b: Any) -> Any:
            out = original(a, b)
            if not isinstance(out, DTensor) or out.placements != (Shard(out.dim() - 1),):
                return out
            return out.redistribute(out.device_mesh, [Shard(0)])

        return mul

    with _mul_replaced(wrong_dim), pytest.MonkeyPatch.context() as mp:
        # the row-wise Linear's graph recompiles for its input's new layout, and inductor's FX
        # graph cache then fails evaluating its own guards (NameError: torch 2.10's, on the pin)
        mp.setattr("torch._inductor.config.fx_graph_cache", False)
        yield


Mul = Callable[[Any, Any], Any]


@contextlib.contextmanager
def _mul_replaced(replacement: Callable[[Mul], Mul]) -> Iterator[None]:
    """Thunder's DTensor multiply, as a trace calls it, replaced by ``replacement`` of it."""
    from thunder.torch.experimental import dtensor_torch_and_prims as prims

    call_ctx = _call_ctx(prims.dtensor_mul_prim_impl)
    (name,) = call_ctx
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(call_ctx, name, replacement(call_ctx[name]))
        yield


def _call_ctx(operator: Any) -> dict[str, Any]:
    """The name -> function that Thunder's executor binds a registered operator to when a trace
    calls it (``OperatorExecutor.register_operator``'s ``call_ctx``, held by its bind hook)."""
    for cell in operator._bind_postprocess.__closure__ or ():
        if isinstance(cell.cell_contents, dict):
            return cell.cell_contents
    raise AssertionError(f"{operator.name}: no call context in its bind hook (Thunder's executors changed)")

"""What each backward reduces, judged by bytes and dtype (conformance/checks/reductions.py):
the expectation comes from the model and the world size; a reduction in another dtype is a
finding that names it; what Thunder put in the trace never crashes the judgement."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from conformance.checks.findings import Findings
from conformance.checks.reductions import expected_reduced_bytes, judge_backward

pytest.importorskip("thunder")


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(torch.bfloat16)
    model[0].bias.requires_grad_(False)  # frozen: never reduced
    return model


def _trace(kind: str, *inputs: Any) -> Any:
    from thunder.distributed.prims import PrimIDs

    sym = SimpleNamespace(id=getattr(PrimIDs, kind.upper()), is_fusion=False, name=kind)
    return SimpleNamespace(
        bound_symbols=[SimpleNamespace(sym=sym, flat_proxy_args=list(i), flat_proxy_outs=[]) for i in inputs]
    )


def _proxy(name: str, shape: tuple[int, ...], dtype: str) -> Any:
    from thunder.core import dtypes

    return SimpleNamespace(name=name, shape=shape, dtype=getattr(dtypes, dtype))


def test_expected_bytes_pad_dim0_under_fsdp_and_not_under_ddp() -> None:
    # trainable: weight (3, 4), weight (2, 3), bias (2,); at world size 2, 3 rows pad to 4
    assert expected_reduced_bytes(_model(), 2, replicated=False) == (4 * 4 + 2 * 3 + 2) * 2
    assert expected_reduced_bytes(_model(), 2, replicated=True) == (3 * 4 + 2 * 3 + 2) * 2


def test_reductions_in_the_gradients_dtype_and_bytes_pass() -> None:
    found = Findings()
    trace = _trace(
        "reduce_scatter",
        [_proxy("a", (4, 4), "bfloat16")],
        [_proxy("b", (2, 3), "bfloat16")],
        [_proxy("c", (2,), "bfloat16")],
    )
    judge_backward(found, "backward", trace, _model(), 2, False, bytes_=True)
    assert not found.failures, found.failures


def test_an_upcast_reduction_is_named_with_the_dtype_found_and_expected() -> None:
    found = Findings()
    trace = _trace(
        "all_reduce",
        [_proxy("a", (3, 4), "bfloat16")],
        [_proxy("b", (2, 3), "bfloat16")],
        [_proxy("t_9", (2,), "float32")],
    )
    judge_backward(found, "backward", trace, _model(), 2, True, bytes_=True)
    assert found.failures == [
        "backward all_reduce dtypes: expected the gradients' dtype bfloat16, got "
        "all_reduce 3 of 3 (t_9, 8 B) in float32",
        "backward all-reduced bytes: expected 40, got 44",
    ]


def test_a_reduction_without_a_tensor_input_is_a_finding_not_a_crash() -> None:
    found = Findings()
    trace = _trace("reduce_scatter", [], [SimpleNamespace(name="n")])
    judge_backward(found, "no_sync backward", trace, _model(), 2, False, bytes_=False)
    assert found.failures == [
        "no_sync backward reduce_scatter dtypes: expected the gradients' dtype bfloat16, got "
        "reduce_scatter 1 of 2 (no input) in no dtype; reduce_scatter 2 of 2 (n) in no dtype"
    ]

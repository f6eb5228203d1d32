"""The buckets DDP must pack gradients into, derived from the model and the bucket size the
cell's bucketing names (conformance/checks/buckets.py): per dtype, in the parameters'
order, a bucket closes once it holds at least the cap; frozen parameters are never packed."""

from __future__ import annotations

import types

import torch
from torch import nn

from conformance.checks import memory
from conformance.checks.buckets import ddp_bucket_mb, ddp_buckets
from conformance.checks.collectives import expected_counts
from conformance.checks.declared import UNBUCKETED
from conformance.checks.memory import arithmetic
from conformance.checks.traces import FinalTraces
from conformance.matrix.cells import Cell
from fixtures.compositions import DDP_DEFAULTS
from fixtures.inits import INITS


class Sized(nn.Module):
    """Parameters of 40, 40, 100 and 8 float32 elements, and one frozen, in that order."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(40))
        self.b = nn.Parameter(torch.zeros(40))
        self.c = nn.Parameter(torch.zeros(100))
        self.d = nn.Parameter(torch.zeros(8))
        self.frozen = nn.Parameter(torch.zeros(1000), requires_grad=False)


def test_layer_buckets_close_at_the_largest_gradient() -> None:
    m = Sized()
    assert ddp_bucket_mb(m, "layer") * 2**20 == 400  # the largest trainable gradient: c's 400 bytes
    # a: 160, b: 320, c: 720 >= 400 closes; d alone is left over
    assert ddp_buckets(m, "layer") == [["a", "b", "c"], ["d"]]
    assert expected_counts(m, "zero2", "layer", replicated=True)["backward"]["all_reduce"] == 2


def test_without_buckets_every_trainable_gradient_is_its_own() -> None:
    m = Sized()
    assert ddp_bucket_mb(m, "none") == 0.0
    assert ddp_buckets(m, "none") == [["a"], ["b"], ["c"], ["d"]]


def test_the_default_size_packs_each_dtype_apart() -> None:
    m = Sized()
    m.d.data = m.d.data.to(torch.bfloat16)
    assert ddp_bucket_mb(m, "block") == DDP_DEFAULTS["bucket_size_in_mb"] == 25.0
    assert ddp_buckets(m, "block") == [["a", "b", "c"], ["d"]]
    counts = expected_counts(m, "zero2", "block", replicated=True)
    assert counts["backward"]["all_reduce"] == 2 and counts["forward"]["all_reduce"] == 0


def test_a_tied_weight_is_packed_once() -> None:
    m = Sized()
    m.e = m.a  # a second name of a's storage
    assert ddp_buckets(m, "none") == [["a"], ["b"], ["c"], ["d"]]


def _ddp_run(bucketing: str, declared: frozenset[str] = frozenset(), all_reduces: int = 0) -> types.SimpleNamespace:
    """The fields of a DDP cell's record that the memory area's terms read: what the xfails
    file ``declared`` of the Thunder there, and a backward trace that all-reduces
    ``all_reduces`` tensors (which the terms must never read)."""
    from thunder.distributed.prims import PrimIDs

    cell = Cell(model="sized", init="real", composition="ddp_jit", bucketing=bucketing)
    bsyms = [types.SimpleNamespace(sym=types.SimpleNamespace(id=PrimIDs.ALL_REDUCE))] * all_reduces
    return types.SimpleNamespace(
        cell=cell,
        eager_model=Sized(),
        device=torch.device("cpu"),
        backend="gloo",
        init=INITS["real"],
        traces=FinalTraces(forward=None, backward=types.SimpleNamespace(bound_symbols=bsyms)),
        declared=declared,
    )


def test_memory_holds_the_bucket_buffers_the_rule_packs_unless_the_xfails_file_declares_none() -> None:
    # layer buckets: [a, b, c] (720 B) and [d] (32 B), each one flat buffer held from the first
    # backward on, whatever the backward trace shows: a Thunder's own trace never widens its bound
    for all_reduces in (2, 4):
        assert arithmetic.terms(_ddp_run("layer", all_reduces=all_reduces)).gradient_buckets == 720 + 32
    # where the xfails file declares that this Thunder packs nothing, the held bound leaves
    # nothing for buffers that do not exist (a leak would hide there)
    assert arithmetic.terms(_ddp_run("layer", frozenset({UNBUCKETED}), all_reduces=2)).gradient_buckets == 0
    # without buckets nothing is packed
    assert arithmetic.terms(_ddp_run("none")).gradient_buckets == 0


def test_the_measured_steps_phases_start_from_the_bucket_buffers_a_packing_backward_left() -> None:
    # the forward and backward peaks of the measured step are bounded above what that step
    # started from: the buffers a packing backward keeps from the first backward on are part of
    # it (0.2.1 and 0.2.3 pack: their DDP forward peaks were over by about the buffers' bytes)
    from conformance.checks.findings import Findings
    from conformance.checks.record import MEASURED_STEP

    assert MEASURED_STEP > 0
    for declared, kept in ((frozenset(), 720 + 32), (frozenset({UNBUCKETED}), 0)):
        run = _ddp_run("layer", declared)
        model = arithmetic.terms(run)
        gradients = sum(p.numel() * 4 for p in run.eager_model.parameters() if p.requires_grad)
        run.steps = [types.SimpleNamespace(optimizer="SGD")] * 3
        run.memory = types.SimpleNamespace(
            held_after_backward=[gradients + kept] * 3,
            held_after_step=[kept] * 3,
            step_peaks=[],
            eager_step_peaks=[],
            eager_peaks={"forward": 0},  # what a known non-conformance's template may read
        )
        found = Findings()
        assert memory._held_after_steps(run, model, found) == kept
        assert found.failures == []

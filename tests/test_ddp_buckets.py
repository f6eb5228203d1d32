"""The buckets DDP must pack gradients into, derived from the model and the bucket size the
cell's bucketing names (conformance/checks/collectives.py): per dtype, in the parameters'
order, a bucket closes once it holds at least the cap; frozen parameters are never packed."""

from __future__ import annotations

import torch
from torch import nn

from conformance.checks.collectives import DDP_DEFAULT_BUCKET_MB, ddp_bucket_mb, ddp_buckets, expected_counts


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
    assert ddp_bucket_mb(m, "block") == DDP_DEFAULT_BUCKET_MB
    assert ddp_buckets(m, "block") == [["a", "b", "c"], ["d"]]
    counts = expected_counts(m, "zero2", "block", replicated=True)
    assert counts["backward"]["all_reduce"] == 2 and counts["forward"]["all_reduce"] == 0


def test_a_tied_weight_is_packed_once() -> None:
    m = Sized()
    m.e = m.a  # a second name of a's storage
    assert ddp_buckets(m, "none") == [["a"], ["b"], ["c"], ["d"]]

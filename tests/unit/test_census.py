"""The memory census reads every tensor alive in a rank (conformance/rank/measure.py), Thunder's
included, whatever Thunder made of them (issue 41): a tensor on ``meta``, of another dtype, a
view, a 0-d scalar, one whose torch ops raise, one that will not even say its device. Kept
alive beside what the census already sees, each adds exactly its storage's bytes once (a meta
tensor none; a storage only 0-d tensors view is counted as a scalar), and the census never
raises: a crash there would be the kit's, hiding every memory finding of the cell."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.rank import measure
from tests.support.hostile import Raising

CPU = torch.device("cpu")
DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool, torch.uint8)


class Unreadable(torch.Tensor):
    """A tensor every torch function on which raises, metadata included (its device, its
    storage, its dimensions): what a broken tensor subclass of Thunder's would be."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise RuntimeError(f"planted: {getattr(func, '__name__', func)} on a tensor Thunder made")


WAYS = ("plain", "view", "meta", "raise", "unreadable", "twice")


def hostile_tensors(dtype: torch.dtype, shape: tuple[int, ...], way: str) -> tuple[list[torch.Tensor], int, int]:
    """Tensors as Thunder might leave them alive, the bytes they add and the scalars."""
    base = torch.zeros(shape, dtype=dtype)
    nbytes = base.untyped_storage().nbytes()
    if way == "meta":
        return [torch.empty(shape, dtype=dtype, device="meta")], 0, 0
    if way == "view":  # a view of it beside it: one storage
        kept = [base, base.reshape(-1)[: max(base.numel() - 1, 0)]]
    elif way == "raise":
        kept = [base.as_subclass(Raising)]
    elif way == "unreadable":
        kept = [torch.Tensor._make_subclass(Unreadable, base)]  # no plain tensor beside it
    elif way == "twice":  # the same storage under two tensor objects of different kinds
        kept = [base, base.as_subclass(Raising)]
    else:
        kept = [base]
    if nbytes == 0:
        return kept, 0, 0
    scalar = base.dim() == 0 and way != "view"  # a 1-d view of a scalar's storage makes it bytes
    return kept, 0 if scalar else nbytes, int(scalar)


@settings(max_examples=12, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 5), max_size=3).map(tuple),
    way=st.sampled_from(WAYS),
)
def test_the_census_counts_each_storage_thunder_left_once_and_never_raises(dtype, shape, way) -> None:
    before = measure.census(CPU, set(), limit_s=0.0)
    kept, nbytes, scalars = hostile_tensors(dtype, shape, way)  # alive across the second reading
    after = measure.census(CPU, set(), limit_s=0.0)
    del kept
    assert (after.nbytes - before.nbytes, after.scalars - before.scalars) == (nbytes, scalars)

"""Bugs in how FSDP cuts a parameter into shards: the wrong chunk, the wrong padding, the
wrong offset."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conformance.matrix.cells import Cell
from fixtures import patterns
from tests.planted.cells import ALL, DDP, FSDP, NONE, REAL
from tests.planted.record import Expect, planted


@contextlib.contextmanager
def _shard_tensor_as(replace: Callable[[Any], Callable[..., Any]]) -> Iterator[None]:
    """Thunder's FSDP cutting every shard with ``replace(original)`` for its ``_shard_tensor``."""
    import thunder.distributed.transforms.fsdp_v2 as fsdp_v2

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp_v2, "_shard_tensor", replace(fsdp_v2._shard_tensor))
        yield


def _at_slot(slot: Callable[[int, int], int]) -> contextlib.AbstractContextManager[None]:
    """Each rank cut the shard of ``slot(rank, world_size)``: a right shard in the wrong place."""

    def replace(original: Callable[..., Any]) -> Callable[..., Any]:
        def shard(param: Any, rank: int, world_size: int, *args: Any, **kwargs: Any) -> Any:
            return original(param, slot(rank, world_size), world_size, *args, **kwargs)

        return shard

    return _shard_tensor_as(replace)


# Module init draws fresh weights, so a permuted shard is invisible to the values there,
# except that the padding rows Thunder left uninitialized become weights; the state-dict
# round trip loads through the same wrong sharding.
@planted(
    {
        "materialization": Expect(REAL, ALL, "initial parameters ["),
        "numerics": Expect(REAL, ALL, "output at step 0"),
        "state_dict": Expect(NONE, ALL),
    }
)
@contextlib.contextmanager
def wrong_shard() -> Iterator[None]:
    """Each rank keeps its neighbour's chunk of every parameter."""
    with _at_slot(lambda rank, world_size: (rank + 1) % world_size):
        yield


def _padded_shard(param: Any, world_size: int, chunk: int, start: int) -> tuple[Any, int | None]:
    """``chunk`` rows of ``param`` from row ``start``, padded with zeros past its end."""
    import torch

    rows = max(chunk * world_size, param.shape[0])
    padded = torch.zeros((rows, *param.shape[1:]), dtype=param.dtype, device=param.device)
    padded[: param.shape[0]].copy_(param)
    return padded.narrow(0, start, chunk).clone(), (chunk * world_size - param.shape[0]) or None


# A shard one row too long (only where the world divides dim 0: some parameter of every
# model at 2 ranks) cannot be gathered as held: numerics names its shape; the other areas
# see the extra row's bytes, NaN or a failed load.
@planted(
    {
        "numerics": Expect(FSDP, NONE, "not gathered as Thunder held it: rank 0: shape ( | did not run"),
        **{area: Expect(NONE, FSDP) for area in ("materialization", "collectives", "memory", "state_dict", "offload")},
    },
    cells=(lambda c: REAL(c) and FSDP(c) and c.world_size == 2, DDP),
    at_scale=True,
)
@contextlib.contextmanager
def padding_when_divisible() -> Iterator[None]:
    """Dim 0 padded to the next multiple of the world size even when it is one already
    (``(D // N + 1) * N``): a chunk one row too long, only where N divides D."""

    def shard(param: Any, rank: int, world_size: int, *args: Any, **kwargs: Any) -> Any:
        chunk = param.shape[0] // world_size + 1
        return _padded_shard(param, world_size, chunk, chunk * rank)

    with _shard_tensor_as(lambda original: shard):
        yield


# only simulated worlds at scale show it (tests/planted/test_scale.py predicts the ranks)
@planted(at_scale=True)
@contextlib.contextmanager
def offset_off_past_first_rank() -> Iterator[None]:
    """Every rank but the first cuts its shard one row early: each holds its predecessor's
    last row (shapes, collectives and bytes unchanged)."""

    def shard(param: Any, rank: int, world_size: int, *args: Any, **kwargs: Any) -> Any:
        chunk = patterns.chunk_rows(param.shape[0], world_size)
        return _padded_shard(param, world_size, chunk, max(0, chunk * rank - 1))

    with _shard_tensor_as(lambda original: shard):
        yield


# the records of a slot permutation in string order, and where each must fail the sharding area
# (tests/planted/test_scale.py runs them there; the order's tests and tools/first_failures.py
# read the same prediction)
STRING_ORDER = ("slots_in_string_order", "state_dict_slots_in_string_order")


def shows_string_order(cell: Cell) -> bool:
    """Where a string-order slot permutation must fail the sharding area: a simulated world
    past 10 ranks (the identity below) under module init, where Thunder cuts every shard
    itself; from a transformed state dict it loads the kit's."""
    return cell.simulated and cell.world_size > 10 and cell.init == "meta_module_init"


def _string_order_slot(rank: int, world_size: int) -> int:
    from tests.support.permutations import decimal_order

    return decimal_order(world_size)[rank]


# only simulated worlds past 10 ranks show it, through module init (tests/planted/test_scale.py
# predicts the ranks); a cell initialized from a transformed state dict holds the kit's shards
@planted(at_scale=True)
@contextlib.contextmanager
def slots_in_string_order() -> Iterator[None]:
    """Each rank is cut the shard of its number's place in string order ("0" < "1" < "10" <
    "100" < … < "2"), as when slots come from sorted store keys: the identity up to 10 ranks,
    a permutation beyond."""
    with _at_slot(_string_order_slot):
        yield


# the same permutation on the state-dict path alone, which module init loads each submodule
# through (and load_original_state_dict, on no simulated cell): the module's own sharding of
# its (meta) parameters is right
@planted(at_scale=True)
@contextlib.contextmanager
def state_dict_slots_in_string_order() -> Iterator[None]:
    """FSDP's transform_state_dict_for_submodule cuts each tensor at the string-order slot of
    the rank; transform_module cuts at the right one."""
    import thunder.distributed.transforms.fsdp_v2 as fsdp_v2

    original = fsdp_v2.FSDPTransform.transform_state_dict_for_submodule

    def transform(self: Any, *args: Any, **kwargs: Any) -> Any:
        rank = self.global_rank
        self.global_rank = _string_order_slot(rank, self.world_size)
        try:
            return original(self, *args, **kwargs)
        finally:
            self.global_rank = rank

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp_v2.FSDPTransform, "transform_state_dict_for_submodule", transform)
        yield

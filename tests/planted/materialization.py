"""Bugs of materialization and module init: a module left unloaded, and values drawn near
the thresholds (only the values Thunder draws change, and the eager model adopts them, so
nothing but materialization can see them)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conformance.matrix.cells import Cell
from conformance.matrix.initialization import plan
from fixtures.models import fixture_for
from tests.planted.cells import ALL, MODULE_INIT, NONE, PARTLY_META, RANDOM_BUFFER, REAL, RESUME, THUNDERS
from tests.planted.record import Expect, planted


# The bug skips the first load of a cell: materialization on meta, else the state-dict
# round trip, which loads through the same loader.
@planted(
    {
        "materialization": Expect(MODULE_INIT, NONE, "initial parameters ["),
        "numerics": Expect(NONE, ALL),
        "state_dict": Expect(REAL, ALL, "load_original_state_dict round trip ["),
    }
)
@contextlib.contextmanager
def one_module_not_materialized() -> Iterator[None]:
    """Materialization forgets the first module it should load: its tensors stay uninitialized."""
    from thunder.core.module import ThunderModule

    original = ThunderModule._transform_and_load_for_submodule
    skipped: list[str] = []

    def load(self: Any, submodule_name: str, state_dict: dict, *args: Any, **kwargs: Any) -> Any:
        if not skipped and any(k.endswith("weight") for k in state_dict):
            skipped.append(submodule_name)
            return None
        return original(self, submodule_name, state_dict, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "_transform_and_load_for_submodule", load)
        yield


@contextlib.contextmanager
def _during_module_init(patch: Callable[[Any, pytest.MonkeyPatch], None]) -> Iterator[None]:
    """Apply ``patch(thunder_module, monkeypatch)`` only while module init materializes the
    parameters (not for the non-persistent buffers, nor for later state-dict loads)."""
    import thunder.transforms.materialization as materialization

    original = materialization.module_init_from_original_module_init

    def init(transform: Any, tm: Any, *args: Any, non_persistent_only: bool = False, **kwargs: Any) -> Any:
        with pytest.MonkeyPatch.context() as inner:
            if not non_persistent_only:
                patch(tm, inner)
            return original(transform, tm, *args, non_persistent_only=non_persistent_only, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(materialization, "module_init_from_original_module_init", init)
        yield


def _linears(tm: Any, untied: bool = False, model: bool = False) -> list[Any]:
    """The nn.Linear modules of a Thunder module's model (``model``: of the model ``tm``
    itself); ``untied``: those whose weight no other module shares."""
    from torch import nn

    root = tm if model else tm._model
    uses: dict[int, int] = {}
    for _, p in root.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    linears = [m for m in root.modules() if isinstance(m, nn.Linear)]
    return [m for m in linears if not untied or uses[id(m.weight)] == 1]


def _after_reset(mp: pytest.MonkeyPatch, marked: Any, change: Callable[[Any], None]) -> None:
    """After ``reset_parameters`` of the module copy Thunder makes of ``marked``, ``change`` it."""
    import torch
    from torch import nn

    marked._planted = True  # copy.copy carries it to Thunder's module copy
    reset = nn.Linear.reset_parameters

    def reset_parameters(self: Any) -> None:
        reset(self)
        if getattr(self, "_planted", False):
            with torch.no_grad():
                change(self)

    mp.setattr(nn.Linear, "reset_parameters", reset_parameters)


@planted({"materialization": Expect(MODULE_INIT, NONE, "values outside [")})
@contextlib.contextmanager
def module_init_draws_wider() -> Iterator[None]:
    """Module init draws the largest untied Linear weight from a uniform 5% wider than
    Linear.reset_parameters' (about 5% of its values land just outside the bound)."""

    def patch(tm: Any, mp: pytest.MonkeyPatch) -> None:
        largest = max(_linears(tm, untied=True), key=lambda m: m.weight.numel())
        _after_reset(mp, largest, lambda m: m.weight.mul_(1.05))

    with _during_module_init(patch):
        yield


# the fewest values at which the scale test detects std x 0.8 with certainty (0.8^64 < ALPHA)
NARROWED_SIZE = 64


@functools.cache
def _has_narrowed(model: str, spec: str | None, tie: str) -> bool:
    """Whether the model has an untied Linear weight of at least NARROWED_SIZE values (built
    on the meta device, nothing drawn)."""
    import torch

    with torch.device("meta"):
        module = fixture_for(model, spec).build(tie == "tied")
    return any(m.weight.numel() >= NARROWED_SIZE for m in _linears(module, untied=True, model=True))


def NARROWED(cell: Cell) -> bool:
    return MODULE_INIT(cell) and _has_narrowed(cell.model, cell.spec, cell.tie)


@planted(
    {"materialization": Expect(NARROWED, NONE, "values within ±")},
    cells=(
        lambda c: NARROWED(c) and c.model == "root_owned",
        lambda c: NARROWED(c) and c.model == "mlp",
        lambda c: not MODULE_INIT(c) and c.model == "root_owned",
    ),
)
@contextlib.contextmanager
def module_init_std_narrowed() -> Iterator[None]:
    """Module init draws the smallest untied Linear weight of at least 64 values (root_owned's
    8 x 8 ``lin.weight``: exactly 64) with its std scaled by 0.8 (the uniform narrowed to
    ±0.8/√fan_in): in bounds, not constant, its mean right; only the scale test sees it."""

    def patch(tm: Any, mp: pytest.MonkeyPatch) -> None:
        big = [m for m in _linears(tm, untied=True) if m.weight.numel() >= NARROWED_SIZE]
        if big:
            smallest = min(big, key=lambda m: m.weight.numel())
            _after_reset(mp, smallest, lambda m: m.weight.mul_(0.8))

    with _during_module_init(patch):
        yield


@planted({"materialization": Expect(MODULE_INIT, NONE, "shards of ranks 0 and 1 (")})
@contextlib.contextmanager
def shards_copied_from_rank0() -> Iterator[None]:
    """Under module init every rank keeps rank 0's shard of the first weight (a 2-d parameter):
    in bounds and distributed right, but the ranks' shards are copies of one another."""
    import thunder.distributed.transforms.fsdp_v2 as fsdp_v2

    def patch(tm: Any, mp: pytest.MonkeyPatch) -> None:
        first = next(n for n, p in tm._model.named_parameters() if p.dim() == 2)
        original = fsdp_v2._shard_tensor

        def shard(param: Any, rank: int, world_size: int, name: str, *args: Any, **kwargs: Any) -> Any:
            return original(param, 0 if name == first else rank, world_size, name, *args, **kwargs)

        mp.setattr(fsdp_v2, "_shard_tensor", shard)

    with _during_module_init(patch):
        yield


@planted({"materialization": Expect(MODULE_INIT, NONE, "values equal")})
@contextlib.contextmanager
def small_tensor_constant() -> Iterator[None]:
    """Module init fills the smallest Linear bias (or, in a model without biases, the smallest
    untied Linear weight) with one constant inside its bounds, a quarter of the way to
    1/√fan_in: on ≤ 7 values even a KS test against the exact uniform passes."""

    def patch(tm: Any, mp: pytest.MonkeyPatch) -> None:
        biases = [(m, "bias") for m in _linears(tm) if m.bias is not None]
        module, leaf = min(
            biases or [(m, "weight") for m in _linears(tm, untied=True)],
            key=lambda c: getattr(c[0], c[1]).numel(),
        )
        _after_reset(mp, module, lambda m: getattr(m, leaf).fill_(0.25 / m.in_features**0.5))

    with _during_module_init(patch):
        yield


@planted(
    {
        "materialization": Expect(lambda c: MODULE_INIT(c) and RANDOM_BUFFER(c), NONE, "buffers on every rank"),
        "numerics": Expect(NONE, lambda c: MODULE_INIT(c) and RANDOM_BUFFER(c)),
        # a full checkpoint holds rank 0's draw: resumed on the other ranks, their buffers change
        "state_dict": Expect(NONE, lambda c: MODULE_INIT(c) and RANDOM_BUFFER(c) and RESUME(c)),
    },
    cells=(lambda c: MODULE_INIT(c) and RANDOM_BUFFER(c), lambda c: MODULE_INIT(c) and not RANDOM_BUFFER(c)),
)
@contextlib.contextmanager
def module_init_draws_per_rank() -> Iterator[None]:
    """Module init seeds each rank's generator by its rank before drawing: every shard is
    still a valid draw, but a replicated buffer drawn at random differs from rank to rank."""
    import torch
    import torch.distributed as dist

    with _during_module_init(lambda tm, mp: torch.manual_seed(4242 + dist.get_rank())):
        yield


class _EveryNameOnceAny(set):
    """A set of names that, once it holds any, answers that it holds every name."""

    def __contains__(self, name: object) -> bool:
        return bool(len(self))


@planted(
    {
        "materialization": Expect(PARTLY_META, NONE, "initial parameters ["),
        # eager keeps the loaded weights Thunder re-drew: outputs part from step 0
        "numerics": Expect(PARTLY_META),
        # re-initializing every module allocates what materializing the fresh part alone does not
        "memory": Expect(NONE, PARTLY_META),
        "state_dict": Expect(NONE, PARTLY_META),
    },
    cells=(
        PARTLY_META,
        MODULE_INIT,
        lambda c: REAL(c) and not PARTLY_META(c) and c.composition == "jit_fsdp",
    ),
)
@contextlib.contextmanager
def loaded_modules_reinitialized() -> Iterator[None]:
    """Once some tensor was on meta, module init re-initializes every module, the loaded ones
    too (Thunder's 2024 regression): a model wholly on meta cannot tell, a real one
    materializes nothing, and a partly-meta one loses its loaded weights to fresh draws."""
    import thunder.transforms.materialization as materialization

    original = materialization.module_init_from_original_module_init

    def init(transform: Any, tm: Any, *args: Any, **kwargs: Any) -> Any:
        transform.have_materialized = _EveryNameOnceAny(transform.have_materialized)
        return original(transform, tm, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(materialization, "module_init_from_original_module_init", init)
        yield


@functools.cache
def _has_non_persistent_buffer(model: str, spec: str | None, tie: str) -> bool:
    """Whether some module of the model owns a non-persistent buffer (built on the meta device)."""
    import torch

    with torch.device("meta"):
        module = fixture_for(model, spec).build(tie == "tied")
    return any(m._non_persistent_buffers_set for m in module.modules())


def NON_PERSISTENT_FROM_STATE_DICT(cell: Cell) -> bool:
    """Thunder materializes the model from a state dict, and some module owns a buffer no
    state dict holds (a rotary cache, root_owned's ramp): module init must still draw it."""
    sd = plan(cell).materialize != "module" and THUNDERS(cell)
    return sd and _has_non_persistent_buffer(cell.model, cell.spec, cell.tie)


# The census's survivor at materialization.py:164 (the call deleted) before root_owned held a
# non-persistent buffer: ci's only state-dict cells of a model with one ran torch.compile's
# executor, which raises at the first forward on the pin.
@planted(
    {"materialization": Expect(NON_PERSISTENT_FROM_STATE_DICT, NONE, "buffers ["), "numerics": Expect(NONE, ALL)},
    cells=(
        NON_PERSISTENT_FROM_STATE_DICT,
        lambda c: MODULE_INIT(c) and _has_non_persistent_buffer(c.model, c.spec, c.tie),
    ),
)
@contextlib.contextmanager
def state_dict_init_skips_non_persistent_buffers() -> Iterator[None]:
    """Materialized from a state dict, the modules that own a non-persistent buffer are not
    initialized first: those buffers, which no state dict holds, keep the memory they got."""
    import thunder.transforms.materialization as materialization

    original = materialization.module_init_from_original_module_init

    def init(transform: Any, tm: Any, *args: Any, non_persistent_only: bool = False, **kwargs: Any) -> Any:
        if non_persistent_only:
            return None
        return original(transform, tm, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(materialization, "module_init_from_original_module_init", init)
        yield

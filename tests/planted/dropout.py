"""Bugs of the dropout masks the eager models replay: outputs and gradients agree, only the
masks' statistics fail."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.planted.cells import BF16, DROPOUT, NONE
from tests.planted.record import Expect, planted


@contextlib.contextmanager
def _dropout_mask(make: Callable[[Any, Any, Callable[[Any, Any], Any]], Any]) -> Iterator[None]:
    """Thunder's dropout mask made by ``make(a, keep, original)`` instead (``original`` the
    helper it replaces: a uniform draw compared with ``keep``)."""
    import thunder.torch as ltorch

    original = ltorch._dropout_helper
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ltorch, "_dropout_helper", lambda a, keep: make(a, keep, original))
        yield


@planted(
    {"numerics": Expect(DROPOUT, NONE, "dropout mask at step 1")},
    cells=(DROPOUT, lambda c: DROPOUT(c) and BF16(c), lambda c: c.model == "mlp"),
)
@contextlib.contextmanager
def dropout_mask_frozen() -> Iterator[None]:
    """The dropout mask fixed when the trace is built (a pattern of the right density instead
    of a draw): every step drops the same elements, p of them."""
    import thunder.torch as ltorch
    import torch

    def frozen(a: Any, keep: Any, original: Any) -> Any:
        # the first keep of the elements kept, the rest dropped: the same every call
        i = ltorch.arange(a.numel(), device=a.device, dtype=torch.float32)
        return ltorch.reshape(ltorch.lt(i, keep * a.numel()), a.shape)

    with _dropout_mask(frozen):
        yield


@planted(
    {"numerics": Expect(DROPOUT, NONE, "dropout fraction dropped")},
    cells=(DROPOUT, lambda c: DROPOUT(c) and c.composition == "jit_fsdp", lambda c: c.model == "mlp"),
)
@contextlib.contextmanager
def dropout_drops_half() -> Iterator[None]:
    """The dropout drops half the elements it should (p / 2), while still scaling the kept by
    1 / (1 - p): outputs and gradients agree with eager replaying the mask; only how many it
    drops is wrong."""
    with _dropout_mask(lambda a, keep, original: original(a, 1 - (1 - keep) / 2)):
        yield


@planted(
    {"numerics": Expect(DROPOUT, NONE, "dropout fraction dropped")},
    cells=(DROPOUT, lambda c: DROPOUT(c) and c.composition == "jit_fsdp", lambda c: c.model == "mlp"),
)
@contextlib.contextmanager
def dropout_rate_off() -> Iterator[None]:
    """The dropout drops p = 0.27 of the elements where the model asks for 0.25 (while scaling
    the kept by 1 / (1 - 0.25)): just past the 0.02 the rate's test promises to detect."""
    with _dropout_mask(lambda a, keep, original: original(a, keep - 0.02)):
        yield

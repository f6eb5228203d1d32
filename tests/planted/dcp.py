"""Bugs planted in Thunder's module under torch.distributed.checkpoint's state dict API,
caught by the state_dict area on the compositions of PyTorch's parallelism where a
ThunderModule is what DCP reads (DDP over ``thunder.jit``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.planted.cells import Pred
from tests.planted.compiled import THUNDERFX
from tests.planted.record import Expect, planted

DDP_OVER_JIT: Pred = lambda cell: cell.composition == "torchddp_jit"  # noqa: E731
# FSDP2 over jit: the root jitted (tied_lm) has its state dict read through the ThunderModule too
FSDP2_OVER_JIT: Pred = lambda cell: cell.composition == "fsdp2_jit"  # noqa: E731


# one key of the whole state dict, the least a dropped entry can be
@planted(
    {"state_dict": Expect(DDP_OVER_JIT, FSDP2_OVER_JIT, "get_model_state_dict keys")},
    cells=(DDP_OVER_JIT, THUNDERFX, FSDP2_OVER_JIT),
    parallelisms=frozenset({"torch"}),
)
@contextlib.contextmanager
def thunder_module_state_dict_drops_last_parameter() -> Iterator[None]:
    """``ThunderModule.state_dict()`` leaves out its last parameter: a checkpoint taken through
    DCP's ``get_model_state_dict`` lacks one weight, and training is untouched."""
    from thunder.core.module import ThunderModule

    original = ThunderModule.state_dict

    def state_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        names = [n for n, _ in self.named_parameters()]
        if names and names[-1] in out:
            del out[names[-1]]
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "state_dict", state_dict)
        yield

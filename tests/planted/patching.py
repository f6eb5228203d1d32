"""Patching helpers more than one family of planted bugs uses."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def thunder_steps(after: Callable[[Any, Any], None] | None = None) -> Iterator[list[int]]:
    """Counts the Thunder module's forward calls (one per training step) and hands each
    call's module and output to ``after``: [steps begun]."""
    from thunder.core.module import ThunderModule

    original, begun = ThunderModule.forward, [0]

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        begun[0] += 1
        out = original(self, *args, **kwargs)
        if after is not None:
            after(self, out)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ThunderModule, "forward", forward)
        yield begun

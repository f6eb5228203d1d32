"""Bugs planted in ThunderFX, caught by the compiled area: what reaches Thunder of a model
composed with PyTorch's parallelism. A composition that trains right because Thunder ran none
of it tests nothing of Thunder: the numerics area alone cannot tell."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.planted.cells import Pred
from tests.planted.record import Expect, planted

THUNDERFX: Pred = lambda cell: cell.composition.startswith("thunderfx")  # noqa: E731
JITTED: Pred = lambda cell: cell.composition in ("torchddp_jit", "fsdp2_jit")  # noqa: E731


@planted(
    {"compiled": Expect(THUNDERFX, words="Thunder compiled nothing the cell ran")},
    cells=(THUNDERFX, JITTED),
    parallelisms=frozenset({"torch"}),
)
@contextlib.contextmanager
def thunderfx_hands_every_graph_to_eager() -> Iterator[None]:
    """ThunderFX's splitter finds nothing Thunder supports: every graph Dynamo captures runs as
    the captured FX graph, eagerly, and the model still trains exactly as eager does."""
    from thunder.dynamo import compiler
    from thunder.dynamo.utils import SplitReason, SplitReasonType, SubgraphInfo

    def _splitter(gm: Any, *args: Any, **kwargs: Any) -> Any:
        reason = SplitReason(SplitReasonType.UNSUPPORTED_NODE, "planted: no node is supported")
        return gm, SubgraphInfo(gm, None, None, None, None, {}, [reason])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiler, "_splitter", _splitter)
        yield

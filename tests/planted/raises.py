"""Raises planted in Thunder: a cell that a ``raises`` entry of the pin's xfails file expects to
end with one raise ends with another. The entry matches a raise by its type, a substring of its
message and the Thunder frame it comes from; one that differs in any of them is a new
non-conformance, never the known one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from conformance.checks.registry import AREAS
from tests.planted.cells import DDP, FSDP, Pred
from tests.planted.record import Expect, planted

TORCHCOMPILE: Pred = lambda cell: cell.executors == "torchcompile"  # noqa: E731
TORCHCOMPILE_FSDP: Pred = lambda cell: TORCHCOMPILE(cell) and FSDP(cell)  # noqa: E731
TORCHCOMPILE_DDP: Pred = lambda cell: TORCHCOMPILE(cell) and DDP(cell)  # noqa: E731


# Near the entry's threshold: the same type, raised through the same Thunder frame
# (torchex.py's no_autocast_fn, which calls the compiled region), only the message differs.
# DDP's torchcompile cells raise their own entry's IndexError before any region runs: they
# stay expected failures.
@planted(
    {area: Expect(TORCHCOMPILE_FSDP, words="expects raises torch._dynamo.exc.Unsupported") for area in AREAS},
    cells=(TORCHCOMPILE_FSDP, TORCHCOMPILE_DDP),
    at_raises=True,
)
@contextlib.contextmanager
def torch_compile_region_graph_breaks_elsewhere() -> Iterator[None]:
    """Every region the torchcompile executor compiles raises Dynamo's Unsupported when it
    runs, as the pin's FSDP cells do, but for another graph break than the asynchronous
    collective that xfails.toml's entry names."""
    import torch._dynamo.exc
    from thunder.executors import torch_compile

    original = torch_compile.make_compiled

    def make_compiled(*args: Any, **kwargs: Any) -> Any:
        original(*args, **kwargs)

        def region(*args: Any, **kwargs: Any) -> Any:
            raise torch._dynamo.exc.Unsupported("planted: a data-dependent branch in the region")

        return region

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch_compile, "make_compiled", make_compiled)
        yield

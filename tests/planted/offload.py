"""Bugs of the offloading transform (transforms/offload.py), or of the Transform API it
relies on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.planted.cells import NONE, OFFLOADING
from tests.planted.record import Expect, planted


@planted({"offload": Expect(OFFLOADING, NONE, "never loaded in the backward")})
@contextlib.contextmanager
def backward_hook_not_called() -> Iterator[None]:
    """As if Thunder stopped handing backward traces to transform_trace_post_optimization:
    the offloading transform rewrites forwards only, nothing is ever loaded back."""
    from thunder.core.trace import TraceTag

    from transforms.offload import OffloadTransform

    original = OffloadTransform.transform_trace_post_optimization

    def forward_only(self: Any, trace: Any, **kwargs: Any) -> Any:
        return trace if TraceTag.BACKWARD in trace.tags else original(self, trace, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OffloadTransform, "transform_trace_post_optimization", forward_only)
        yield


@planted({"offload": Expect(OFFLOADING, NONE, "reads the offloaded")})
@contextlib.contextmanager
def load_after_consumer() -> Iterator[None]:
    """Each load lands after the first op that needs the tensor, which reads the offloaded
    copy instead (same values on CPU to CPU; on CUDA the wrong device)."""
    from thunder.core.prims import PrimIDs
    from thunder.core.proxies import variableify
    from thunder.executors.passes import del_last_used
    from thunder.executors.pythonex import clear_mutable_collection

    from transforms.offload import OffloadTransform, load

    original = OffloadTransform._load_backward

    def late(self: Any, trace: Any) -> Any:
        new = original(self, trace)
        bsyms = [b for b in new.bound_symbols if b.sym.id not in (PrimIDs.DEL, clear_mutable_collection.id)]
        for bsym in [b for b in bsyms if b.sym.id == load.id]:
            loaded, copy = bsym.output, bsym.args[0]
            bsyms.remove(bsym)
            at = next(i for i, b in enumerate(bsyms) if loaded.name in {a.name for a in b.flat_proxy_args})
            bsyms[at] = bsyms[at].from_bsym_swap_proxies({variableify(loaded): copy})
            bsyms.insert(at + 1, bsym)
        new.bound_symbols = bsyms
        return del_last_used(new, clear_mutable_collections=True)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OffloadTransform, "_load_backward", late)
        yield


@planted({"offload": Expect(OFFLOADING, NONE, "saved tensors offloaded")})
@contextlib.contextmanager
def policy_offloads_nothing() -> Iterator[None]:
    """The transform drops what its policy chose: nothing is offloaded."""
    from transforms.offload import OffloadTransform

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OffloadTransform, "_choose", lambda self, candidates, trace: ())
        yield


@planted(
    {
        "offload": Expect(OFFLOADING, NONE, "offloaded originals were kept"),
        "memory": Expect(NONE, OFFLOADING),  # the forward's peak may hold them too
    }
)
@contextlib.contextmanager
def offload_keeps_source() -> Iterator[None]:
    """Each offloaded copy holds on to the tensor it was copied from (as an asynchronous copy
    might, to keep its source alive): originals stay allocated until the backward."""
    import transforms.offload as offload

    original = offload._copy_out

    def copy_out(t: Any, device: Any) -> Any:
        out = original(t, device)
        out._source = t
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(offload, "_copy_out", copy_out)
        yield

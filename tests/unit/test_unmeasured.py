"""Why a torchcompile cell's training goes unmeasured on the CPU, and what its ledger reads:
the CPU tracker is a dispatch mode, under which Dynamo runs a frame op by op instead of the
graph it compiles, so measuring would change what runs (``rank/measure.unmeasurable``)."""

from __future__ import annotations

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from conformance.rank.measure import Ledger, unmeasurable
from fixtures.compositions import COMPOSITIONS
from fixtures.executors import EXECUTORS

CPU = torch.device("cpu")


def _graphs_compiled(ledger: Ledger) -> int:
    """How many graphs Dynamo compiles for a function called inside one of ``ledger``'s phases."""
    torch._dynamo.reset()
    counters.clear()

    @torch.compile(backend="eager")
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin() + 1

    with ledger.phase():
        f(torch.ones(4))
    return counters["stats"]["unique_graphs"]


def test_the_tracker_keeps_dynamo_from_compiling_and_a_blind_ledger_does_not() -> None:
    try:
        assert _graphs_compiled(Ledger(CPU)) == 0  # the frame ran op by op under the tracker
        assert _graphs_compiled(Ledger(CPU, measured=False)) == 1
    finally:
        torch._dynamo.reset()


def test_only_what_torch_compile_runs_goes_unmeasured_and_only_on_the_cpu() -> None:
    fsdp = COMPOSITIONS["fsdp_jit"]
    why = unmeasurable(CPU, EXECUTORS["torchcompile"], fsdp)
    assert why is not None and "torchcompile executor" in why and "dispatch mode" in why
    assert unmeasurable(torch.device("cuda", 0), EXECUTORS["torchcompile"], fsdp) is None  # the allocator's statistics
    assert all(unmeasurable(CPU, e, fsdp) is None for name, e in EXECUTORS.items() if name != "torchcompile")
    # ThunderFX is torch.compile: under the tracker nothing would reach Thunder
    plain = EXECUTORS["default"]
    assert "thunderfx_fsdp2 composition" in unmeasurable(CPU, plain, COMPOSITIONS["thunderfx_fsdp2"])
    assert unmeasurable(CPU, plain, COMPOSITIONS["fsdp2_jit"]) is None


def test_a_blind_ledger_reads_zero_and_holds_nothing() -> None:
    ledger = Ledger(CPU, measured=False)
    with ledger.phase(settle=True) as reading:
        kept = torch.ones(1024)
        reading.mark()
    assert (reading.peak, reading.alive, reading.marks, ledger.read(thorough=True)) == (0, 0, [0], 0)
    del kept

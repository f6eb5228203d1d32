"""What the CPU tracker sees of code torch.compile built, and why a torchcompile cell's
training still goes unmeasured there (``rank/measure.unmeasurable``): the tracker lets Dynamo
compile (it ignores compile internals) and sees what the compiled code runs through the
dispatcher, which Thunder's ThunderFX graphs do and Inductor's generated code does not."""

from __future__ import annotations

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from conformance.rank.measure import Ledger, unmeasurable
from fixtures.executors import EXECUTORS

CPU = torch.device("cpu")


def _graphs_compiled(ledger: Ledger) -> tuple[int, int]:
    """How many graphs Dynamo compiles for a function called inside one of ``ledger``'s
    phases, and what the phase left alive."""
    torch._dynamo.reset()
    counters.clear()

    @torch.compile(backend="eager")
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin() + 1

    x = torch.ones(4)
    with ledger.phase() as reading:
        out = f(x)
    del out
    return counters["stats"]["unique_graphs"], reading.alive


def test_the_tracker_lets_dynamo_compile_and_sees_what_the_graph_runs() -> None:
    try:
        assert _graphs_compiled(Ledger(CPU)) == (1, 16)  # the output: four float32
        assert _graphs_compiled(Ledger(CPU, measured=False)) == (1, 0)
    finally:
        torch._dynamo.reset()


def test_thunderfx_graphs_reach_thunder_under_the_tracker_and_are_measured() -> None:
    """A linear layer through ThunderFX: Thunder compiles the graph, and what its forward
    leaves alive is the output alone (it saves its input and weight, neither allocated)."""
    from thunder.dynamo import thunderfx

    torch._dynamo.reset()
    try:
        layer = nn.Linear(16, 8)
        compiled = thunderfx(layer)
        x = torch.randn(4, 16)
        ledger = Ledger(CPU)
        with ledger.phase() as forward:
            y = compiled(x)
        assert [len(s.thunder_compiled_fns) for s in compiled._backend.subgraph_infos] == [1]
        assert forward.alive == y.nbytes == 4 * 8 * 4
        with ledger.phase() as backward:
            y.sum().backward()
        # the gradients of weight and bias, the output's freed with the graph
        del y
        assert ledger.read() == layer.weight.grad.nbytes + layer.bias.grad.nbytes
        assert backward.peak >= layer.weight.grad.nbytes + layer.bias.grad.nbytes
    finally:
        torch._dynamo.reset()


def test_a_storage_resized_to_nothing_and_back_is_freed_and_allocated_again() -> None:
    """FSDP2 frees an unsharded parameter by resizing its storage to nothing, which no op
    dispatches: a ledger told so reads the size again at every op and every reading."""
    for resizes, after_free, peak in ((True, 0, 8192), (False, 4096, 8192)):
        ledger = Ledger(CPU, resizes=resizes)
        with ledger.phase() as reading:
            kept = torch.ones(1024)  # 4096 B
            kept.untyped_storage().resize_(0)
            freed = ledger.read()
            kept.untyped_storage().resize_(4096)
            kept.fill_(1.0)  # an op on it: the size read again
            other = torch.ones(1024)
        assert (freed, reading.peak) == (after_free, peak)
        del kept, other


def test_only_the_torchcompile_executor_goes_unmeasured_and_only_on_the_cpu() -> None:
    why = unmeasurable(CPU, EXECUTORS["torchcompile"])
    assert why is not None and "torchcompile executor" in why and "Inductor" in why
    assert unmeasurable(torch.device("cuda", 0), EXECUTORS["torchcompile"]) is None  # the allocator's statistics
    assert all(unmeasurable(CPU, e) is None for name, e in EXECUTORS.items() if name != "torchcompile")


def test_a_blind_ledger_reads_zero_and_holds_nothing() -> None:
    ledger = Ledger(CPU, measured=False)
    with ledger.phase(settle=True) as reading:
        kept = torch.ones(1024)
        reading.mark()
    assert (reading.peak, reading.alive, reading.marks, ledger.read(thorough=True)) == (0, 0, [0], 0)
    del kept

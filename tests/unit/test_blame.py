"""Whose code raised, read from synthetic tracebacks: the innermost frame of Thunder's or the
kit's code decides, the kit's instrumentation (the memory tracker's dispatch mode, which every
torch op Thunder issues under measurement passes through) passed over where it only forwarded
the op that raised."""

from __future__ import annotations

import ast
from pathlib import Path

from conformance.frontend.blame import INSTRUMENTATION, KIT, THUNDER, _thunder_root, blame
from conformance.world.launch import ROOT

TORCH = str(Path(__import__("torch").__file__).parent / "_ops.py")
C10D = str(Path(__import__("torch").__file__).parent / "distributed" / "distributed_c10d.py")
MEASURE = str(ROOT / "conformance" / "rank" / "measure.py")


def _thunder(path: str) -> str:
    root = _thunder_root()
    assert root is not None, "the kit's tests run beside the Thunder under test"
    return str(root / path)


def frame(file: str, function: str, line: int = 1) -> dict[str, object]:
    return {"file": file, "line": line, "function": function}


# the kit composes the model under measurement; Thunder's DDP broadcasts; torch's op passes
# through the kit's dispatch mode, then raises
SETUP = [
    frame(str(ROOT / "conformance" / "rank" / "entry.py"), "drive"),
    frame(str(ROOT / "conformance" / "rank" / "build.py"), "compose"),
    frame(str(ROOT / "fixtures" / "compositions.py"), "ddp_jit"),
    frame(_thunder("distributed/__init__.py"), "ddp"),
    frame(_thunder("distributed/transforms/ddp_v2.py"), "transform_module", 76),
    frame(C10D, "broadcast"),
]


def test_a_torch_op_raising_through_the_kits_dispatch_mode_is_thunders() -> None:
    who = blame([*SETUP, frame(MEASURE, "__torch_dispatch__"), frame(TORCH, "__call__")])
    assert who.owner == THUNDER
    assert who.frame is not None and (who.frame.function, who.frame.line) == ("transform_module", 76)


def test_the_kits_own_logic_innermost_is_the_kits() -> None:
    # the tracker's bookkeeping raised after the op returned
    who = blame([*SETUP, frame(MEASURE, "__torch_dispatch__"), frame(MEASURE, "_track", 60)])
    assert who.owner == KIT and who.frame is not None and who.frame.function == "_track"
    # a check that asked torch and torch raised
    gather = frame(str(ROOT / "conformance" / "rank" / "gather.py"), "gather")
    assert blame([*SETUP[:2], gather, frame(C10D, "all_gather")]).owner == KIT


def test_thunders_collective_raising_through_the_waits_wrapper_is_thunders() -> None:
    """rank/waits.py hands Thunder's torch.distributed calls through (a broadcast at setup
    made asynchronous on a hybrid mesh raised inside torch, census mutant fsdp_v2.py:224)."""
    waits = str(ROOT / "conformance" / "rank" / "waits.py")
    who = blame([*SETUP[:-1], frame(waits, "call", 66), frame(C10D, "broadcast")])
    assert who.owner == THUNDER
    assert who.frame is not None and (who.frame.function, who.frame.line) == ("transform_module", 76)


def test_instrumentation_that_raised_itself_is_the_kits() -> None:
    who = blame([*SETUP, frame(MEASURE, "__torch_dispatch__", 55)])  # innermost: no op below it
    assert who.owner == KIT and who.frame is not None and who.frame.function == "__torch_dispatch__"


def test_frames_of_neither_decide_nothing() -> None:
    assert blame([frame(C10D, "broadcast"), frame(TORCH, "__call__")]).owner is None
    assert blame([frame(MEASURE, "__torch_dispatch__"), frame(TORCH, "__call__")]).owner is None
    assert blame(None).owner is None


def _modes_and_instrumentation() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(every dispatch or function mode's hook the kit defines, every function of the kit's code)"""
    hooks, functions = set(), set()
    for package in ("conformance", "fixtures", "transforms"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    functions.add((rel, node.name))
                    if node.name in ("__torch_dispatch__", "__torch_function__"):
                        hooks.add((rel, node.name))
    return hooks, functions


def test_instrumentation_is_declared_and_exists() -> None:
    hooks, functions = _modes_and_instrumentation()
    assert ("conformance/rank/measure.py", "__torch_dispatch__") in hooks  # the memory tracker's
    assert hooks <= INSTRUMENTATION, f"a mode of the kit's that blame would take for the kit's logic: {hooks}"
    missing = INSTRUMENTATION - functions
    assert not missing, f"declared instrumentation that the kit no longer has: {missing}"


def test_an_output_no_loss_can_weigh_is_thunders_non_conformance_not_the_kits() -> None:
    """A Thunder whose FSDP never cuts the padding off a gathered weight returns an output of
    the wrong shape: the rank stops with ThunderReturnedWrong, which the front end reads off
    the rank's traceback as Thunder's, naming what was wrong."""
    import traceback

    import torch

    from conformance.checks.findings import ThunderReturnedWrong, returned_wrong
    from conformance.rank.eager import unweighable

    expected = torch.zeros(4, 8)
    assert unweighable(torch.zeros(4, 8), expected) is None
    assert unweighable(torch.zeros(4, 10), expected) == "has shape (4, 10), eager's (4, 8)"
    assert unweighable(torch.zeros(4, 8, dtype=torch.float64), expected) == (
        "has dtype torch.float64, eager's torch.float32"
    )
    assert unweighable((expected,), expected) == "is a tuple, eager's a tensor of shape (4, 8)"
    try:
        raise ThunderReturnedWrong("step 0: the Thunder module's output has shape (4, 10), eager's (4, 8)")
    except ThunderReturnedWrong as exc:
        error = "".join(traceback.format_exception(exc))
    assert returned_wrong(error) == "step 0: the Thunder module's output has shape (4, 10), eager's (4, 8)"
    assert returned_wrong("Traceback ...\nRuntimeError: boom") is None and returned_wrong(None) is None


def test_a_rank_lost_is_why_its_peer_raised_never_the_kit() -> None:
    """Rank 1 died (or was stopped) while rank 0 waited on it in the kit's own gathering:
    rank 0's raise is the death's consequence. The item fails naming rank 1 and where it was,
    never as the kit's error; a stopped rank is blamed before a peer that only timed out."""
    import types

    import pytest

    from conformance.frontend.verdict import Conformance
    from conformance.matrix.cells import Cell
    from conformance.world import protocol
    from conformance.world.outcome import Outcome
    from tests.unit.test_runner_probe import StandInWorld, make_runner

    gathering = [frame(str(ROOT / "conformance" / "rank" / "gather.py"), "on_every_rank"), frame(C10D, "all_gather")]
    cell = Cell("mlp", "real", "fsdp_jit")
    lost = {
        "died": [
            protocol.RankResult(0, protocol.FAILED, error="RuntimeError: Connection closed by peer", frames=gathering),
            protocol.RankResult(1, protocol.DIED, error="killed by signal SIGKILL", phase="recording setup"),
        ],
        "timeout": [
            protocol.RankResult(0, protocol.TIMEOUT, error="no result", phase="training / step 0 (SGD) / backward"),
            protocol.RankResult(1, protocol.TIMEOUT, error="no result: stopped", phase="scenario train", stopped=True),
        ],
        # a peer that died while waiting on a stopped rank (a watchdog's abort): the stop is why
        "stopped": [
            protocol.RankResult(0, protocol.DIED, error="killed by signal SIGABRT", phase="training / step 1 (SGD)"),
            protocol.RankResult(1, protocol.STOPPED, error="stopped", phase="state dict round trip", stopped=True),
        ],
    }
    for status, results in lost.items():
        runner = make_runner(StandInWorld(2, None))
        runner.outcomes[cell.id] = Outcome(results, 1.0, 0.0)
        node = types.SimpleNamespace(nodeid=f"conformance/test_numerics.py::test_numerics[{cell.id}]")
        with pytest.raises(pytest.fail.Exception) as verdict:
            Conformance(runner, node).expect(cell, "numerics", record=False)
        head, *rest = str(verdict.value).splitlines()
        where = results[1].phase
        assert head == f"cell {cell.id} did not run to completion: rank 1 {status} during {where}"
        assert rest[0] == f"--- rank 1: {status} after 0.0s during {where} ---"

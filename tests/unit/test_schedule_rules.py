"""The schedule area's rules on small traces built by hand (conformance/checks/schedule.py):
the order Thunder's sort_waits makes passes, each way of undoing it is named, and what
Thunder put in a trace (a wait without its collective, a collective never waited, one
issued synchronously, a fusion region holding one) never crashes the judgement."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from conformance.checks.findings import Findings
from conformance.checks.schedule import judge

pytest.importorskip("thunder")


def _future(name: str) -> Any:
    from thunder.core.proxies import FutureTensorProxy

    class Future(FutureTensorProxy):
        def __init__(self, name: str) -> None:
            object.__setattr__(self, "_name", name)

    return Future(name)


def _p(name: str) -> Any:
    return SimpleNamespace(name=name)


def _bsym(sid: Any, name: str, args: list[Any], outs: list[Any], subsymbols: list[Any] | None = None) -> Any:
    sym = SimpleNamespace(id=sid, name=name, is_fusion=subsymbols is not None)
    return SimpleNamespace(sym=sym, flat_proxy_args=args, flat_proxy_outs=outs, subsymbols=subsymbols or [])


def gather(param: str, future: str) -> Any:
    import thunder.executors.torchex as torchex

    return _bsym(torchex.all_gather_prim_impl.id, "all_gather", [_p(param)], [_future(future)])


def reduce(grad: str, future: str) -> Any:
    import thunder.executors.torchex as torchex

    return _bsym(torchex.reduce_scatter_prim_impl.id, "reduce_scatter", [_p(grad)], [_future(future)])


def wait(future: str, out: str) -> Any:
    import thunder.executors.torchex as torchex

    return _bsym(torchex.wait_prim_impl.id, "wait", [_p(future)], [_p(out)])


def op(out: str, *args: str) -> Any:
    return _bsym(f"op_{out}", f"op_{out}", [_p(a) for a in args], [_p(out)])


def ret(*args: str) -> Any:
    from thunder.core.prims import PrimIDs

    return _bsym(PrimIDs.RETURN, "return", [_p(a) for a in args], [])


def _judged(*bsyms: Any) -> Findings:
    found = Findings()
    judge(found, "forward", SimpleNamespace(bound_symbols=list(bsyms)))
    return found


def sorted_forward() -> list[Any]:
    """A two-layer forward as sort_waits orders it: both gathers first, each wait where
    nothing else can run."""
    return [
        gather("w1", "f1"),
        gather("w2", "f2"),
        wait("f1", "g1"),
        op("h", "x", "g1"),
        op("a", "h"),
        wait("f2", "g2"),
        op("y", "a", "g2"),
        ret("y"),
    ]


def test_the_order_sort_waits_makes_passes() -> None:
    found = _judged(*sorted_forward())
    assert not found.failures, found.failures
    assert found.metrics["forward all_gathers"]["max in flight"] == 2


def test_waits_moved_right_after_their_collectives_are_named() -> None:
    g1, g2, w1, h, a, w2, y, end = sorted_forward()
    found = _judged(g1, w1, g2, w2, h, a, y, end)
    assert any("forward all_gather waits when needed: 1 of 2" in f for f in found.failures), found.failures
    assert "the wait for the all_gather of w2" in " ".join(found.failures)


def test_waits_in_another_order_where_nothing_else_can_run_pass() -> None:
    # sort_waits takes waits in the order their collectives became ready; which of two waits
    # comes first where no compute could run between them is not judged
    g1, g2, w1, h, a, w2, y, end = sorted_forward()
    found = _judged(g1, g2, w2, w1, h, a, y, end)
    assert not found.failures, found.failures


def test_a_gather_issued_right_before_its_wait_is_named() -> None:
    bsyms = sorted_forward()
    bsyms.insert(4, bsyms.pop(1))  # the second layer's gather after the first layer's compute
    found = _judged(*bsyms)
    assert any("forward all_gathers issued when ready: 1 of 2" in f for f in found.failures), found.failures


def _zero3_forward(late_at: int | None) -> list[Any]:
    """Four layers under ZERO3, the fourth layer's gather issued with the others (None) or at
    position ``late_at`` of the layers' waits and compute."""
    gathers = [gather(f"w{k}", f"f{k}") for k in range(1, 5)]
    body = [b for k in range(1, 5) for b in (wait(f"f{k}", f"g{k}"), op(f"h{k}", f"h{k - 1}", f"g{k}"))]
    if late_at is not None:
        body.insert(late_at, gathers.pop())
    return [*gathers, *body, ret("h4")]


def _judged_zero3(*bsyms: Any) -> Findings:
    found = Findings()
    judge(found, "forward", SimpleNamespace(bound_symbols=list(bsyms)), zero3=True)
    return found


def test_zero3_may_hold_a_gather_back_only_while_three_are_in_flight() -> None:
    # Thunder's older split capped ZERO3's all-gathers in flight at 3 (limit_in_flight_allgathers):
    # the fourth gather goes right after the first wait, before the compute it frees a slot for
    assert not _judged_zero3(*_zero3_forward(None)).failures
    at_cap = _judged_zero3(*_zero3_forward(1))
    assert not at_cap.failures, at_cap.failures
    below = _judged_zero3(*_zero3_forward(2))  # layer 1's compute ran with only 2 in flight
    assert any("forward all_gathers issued when ready: 1 of 4" in f for f in below.failures), below.failures
    # without ZERO3 no gather may stand back at all
    assert any("issued when ready" in f for f in _judged(*_zero3_forward(1)).failures)


def test_a_gradient_waited_before_the_compute_after_it_is_named() -> None:
    found = _judged(
        op("d2", "c"), reduce("d2", "r2"), wait("r2", "s2"), op("d1", "c", "h"), reduce("d1", "r1"), wait("r1", "s1"),
        ret("s1", "s2"),
    )  # fmt: skip
    assert any("forward reduce_scatter waits when needed" in f for f in found.failures), found.failures


def test_odd_traces_become_findings_never_a_crash() -> None:
    import thunder.executors.torchex as torchex

    synchronous = _bsym(torchex.all_gather_prim_impl.id, "all_gather", [_p("w3")], [_p("g3")])
    outless = _bsym(torchex.all_gather_prim_impl.id, "all_gather", [], [])
    found = _judged(
        gather("w1", "f1"),  # never waited
        wait("nowhere", "g0"),  # no collective issued it
        wait("nowhere", "g0b"),
        synchronous,
        outless,
        _bsym("fusion", "fusion", [_p("w2")], [_p("g2")], [gather("w2", "f2"), wait("f2", "g2")]),
        op("y", "g2", "g0"),
        ret("y"),
    )
    messages = " ".join(found.failures)
    assert "never waited in this trace" in messages
    assert "waits on futures no collective of this trace issued" in messages
    assert "issued synchronously" in messages
    assert found.crash is None


def test_an_empty_trace_has_nothing_to_judge() -> None:
    found = _judged(ret())
    assert not found.failures and not found.metrics

"""What Thunder put into a trace never crashes the collectives check: a collective without an
output or an input becomes a shortfall in the bytes and a named entry in the sequence."""

from __future__ import annotations

from types import SimpleNamespace

from conformance.checks.collectives import _described, _out_bytes


def test_a_collective_without_an_output_adds_no_bytes_and_is_named() -> None:
    empty = SimpleNamespace(flat_proxy_outs=[], flat_proxy_args=[])
    assert _out_bytes([empty, empty]) == 0
    assert _described(empty) == "without an output"

"""Offloading: the reference transform's selection, its placement in Thunder's forward and
backward traces, and what a rank holds between them (see conformance/checks/offload.py)."""

from conformance.matrix.cells import Cell

AREA = "offload"


def test_offload(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

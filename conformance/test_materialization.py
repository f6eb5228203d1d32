"""Materialization: after setup nothing is left on meta, every tensor is on the rank's
device, and the weights are what the init mode promises; a model lacking reset_parameters
is refused with Thunder's TypeError naming the module (see conformance/checks/materialization.py)."""

from conformance.matrix.cells import Cell

AREA = "materialization"


def test_materialization(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

"""Collectives: all-gathers, reduce-scatters and all-reduces in the final forward and backward
traces match what the model's storages imply (see conformance/checks/collectives.py)."""

from conformance.matrix.cells import Cell

AREA = "collectives"


def test_collectives(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

"""Numerics: outputs, full gradients and parameters after a few optimizer steps equal eager
PyTorch within the dtype's tolerance (see conformance/checks/numerics/ for what is compared)."""

from conformance.matrix.cells import Cell

AREA = "numerics"


def test_numerics(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

"""Compiled: what reached Thunder of a model composed with PyTorch's parallelism (see
conformance/checks/compiled.py)."""

from conformance.matrix.cells import Cell

AREA = "compiled"


def test_compiled(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

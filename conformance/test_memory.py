"""Memory: per-phase peaks and what stays alive after setup, against bounds derived from the
model and an estimate from the traces' data flow (see conformance/checks/memory/__init__.py)."""

from conformance.matrix.cells import Cell

AREA = "memory"


def test_memory(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

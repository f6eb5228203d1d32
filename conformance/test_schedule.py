"""Schedule: every collective issued as soon as its inputs are ready and waited only where
nothing else can run, as Thunder's sort_waits orders the final forward and backward traces
(see conformance/checks/schedule.py)."""

from conformance.matrix.cells import Cell

AREA = "schedule"


def test_schedule(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

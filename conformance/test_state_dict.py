"""State dicts: original_state_dict() holds exactly what the shards hold, under the eager
model's keys, and load_original_state_dict() round-trips (see conformance/checks/state_dict.py)."""

from conformance.matrix.cells import Cell

AREA = "state_dict"


def test_state_dict(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

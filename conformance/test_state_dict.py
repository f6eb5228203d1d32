"""State dicts: original_state_dict() holds exactly what the shards hold, under the eager
model's keys, and load_original_state_dict() round-trips (see conformance/state_dict.py)."""

from conformance.cells import Cell

AREA = "state_dict"


def test_state_dict(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

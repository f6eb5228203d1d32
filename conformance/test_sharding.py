"""Sharding: on each sampled rank of a simulated world, every parameter's shard has the shape
dim-0 sharding over the world size implies and holds the rows it must (padding, empty and
partial shards on the last ranks; see conformance/checks/sharding.py)."""

from conformance.matrix.cells import Cell

AREA = "sharding"


def test_sharding(conformance, cell: Cell) -> None:
    conformance.expect(cell, AREA)

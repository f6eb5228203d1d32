"""Tensor parallelism's derivations held to eager PyTorch: a cell of the family driven by the
suite's rank side with eager tensor parallelism where Thunder's compiled model would be. Every
area but what reached Thunder must find it conforming, training (the backward's all-reduces) and
uneven shards included: what the pin never reaches, since its training raises."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.checks.findings import CellResult
from conformance.matrix.cells import Cell
from conformance.world import protocol
from conformance.world.controller import World
from conformance.world.launch import LaunchSpec

pytestmark = pytest.mark.slow  # starts worlds

TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, World]]:
    made: dict[int, World] = {}
    yield made
    for world in made.values():
        world.close()


def _run(worlds: dict[int, World], base: Path, cell: Cell) -> list[CellResult]:
    if cell.world_size not in worlds:
        worlds[cell.world_size] = World(LaunchSpec(nproc=cell.world_size, backend="gloo"), base_dir=base)
    task = protocol.Task("tests.support.tensor_parallel_tasks:eager_in_thunders_place", {"axes": cell.axes()})
    outcome = worlds[cell.world_size].run(task, TIMEOUT_S)
    assert outcome.ok, outcome.describe()
    return [CellResult.from_json(v) for v in outcome.values]


# not ``cell``: the suite's plugin parametrizes a test by that name with a profile's cells
@pytest.mark.parametrize(
    "planned",
    [
        Cell("mlp", "real", "thunderfx_tp", world_size=3),  # 20 hidden rows: 7, 7, 6
        Cell("litgpt_llama", "real", "thunderfx_tp", world_size=2),  # two gates: two backward all-reduces a block
        Cell("litgpt_neox", "real", "thunderfx_tp", tie="tied", scenario="inference", world_size=3),
    ],
    ids=str,
)
def test_eager_tensor_parallelism_conforms_to_every_derivation(worlds, tmp_path_factory, planned: Cell) -> None:
    cell = planned
    for rank, result in enumerate(_run(worlds, tmp_path_factory.mktemp("worlds"), cell)):
        assert set(result.areas) == {"numerics", "collectives", "sharding", "memory", "compiled"}
        for name, found in result.areas.items():
            assert found.crash is None, (rank, name, found.crash)
            codes = [f.code for f in found.found]
            # eager ran every Linear: nothing reached Thunder, what it must not conform to
            wanted = ["compiled.nothing", "compiled.split_off"] if name == "compiled" else []
            assert codes == wanted, (rank, name, found.found)
        counted = result.areas["collectives"].metrics
        assert counted["forward all_reduces"]["expected"] == 2 if cell.model.startswith("litgpt") else 1
        if cell.model == "litgpt_llama":  # both gates of both blocks all-reduce their input's gradient
            assert counted["backward all_reduces"] == {"expected": 4, "actual": 4}

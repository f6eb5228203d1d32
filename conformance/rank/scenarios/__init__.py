"""What a cell does after training, one file per scenario behind one protocol: the
``scenario`` axis value names a function ``(recipe, eager_model, thunder_module, optimizer,
rank, world) -> ScenarioRecord`` here, ``optimizer`` the Thunder module's as training left it
(AdamW, with its state: ``resume`` checkpoints it; the others leave it be). Every scenario
runs after the training steps (their findings stand whatever the scenario does) and
compares against eager PyTorch holding the Thunder module's own weights (``beside.py``);
what Thunder raises becomes the record's ``error``, a finding, never the end of the cell.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conformance.checks.record import ScenarioRecord
from conformance.rank.build import EagerModel, Recipe
from conformance.rank.scenarios.accumulate import accumulate
from conformance.rank.scenarios.infer import infer
from conformance.rank.scenarios.reshape import reshape
from conformance.rank.scenarios.resharded import resume_resharded
from conformance.rank.scenarios.resume import resume
from conformance.rank.scenarios.resume_dcp import resume_dcp

Scenario = Callable[[Recipe, EagerModel, Any, Any, int, int], ScenarioRecord]

# every value of the axis but ``train`` (training alone: no scenario after it)
SCENARIOS: dict[str, Scenario] = {"infer": infer, "accumulate": accumulate, "reshape": reshape, "resume": resume}
# under PyTorch's parallelism (``Composition.parallelism``) a scenario that goes through
# Thunder's own API goes through PyTorch's instead: its checkpoints are DCP's
UNDER_TORCH_PARALLELISM: dict[str, Scenario] = {"resume": resume_dcp}


def run_scenario(
    name: str, recipe: Recipe, eager_model: EagerModel, tm: Any, optimizer: Any, rank: int, world: int
) -> ScenarioRecord | None:
    """The record of scenario ``name`` after training, None for training alone."""
    if recipe.cell.saved_at is not None:  # a checkpoint another world size took
        return resume_resharded(recipe, eager_model, tm, optimizer, rank, world)
    table = {**SCENARIOS, **UNDER_TORCH_PARALLELISM} if recipe.composition.parallelism == "torch" else SCENARIOS
    scenario = table.get(name)
    return None if scenario is None else scenario(recipe, eager_model, tm, optimizer, rank, world)

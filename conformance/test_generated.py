"""Generated models: hypothesis draws small models (fixtures/strategies.py) and every example
runs as a cell in the real world, held to every check area. A failing example shrinks to a
minimal model and prints a one-line replay.

Hypothesis profiles (``--hypothesis-profile``): ``dev``, ``ci`` (the default: derandomized,
a few examples), ``nightly``.
"""

from __future__ import annotations

import json

from hypothesis import given, note
from hypothesis import strategies as st

from conformance.matrix.cells import Cell
from fixtures.offloads import POLICIES
from fixtures.strategies import model_specs


@given(
    spec=model_specs(),
    init=st.sampled_from(["real", "meta_module_init"]),
    composition=st.sampled_from(["fsdp_jit", "jit_fsdp"]),
    offload=st.sampled_from(list(POLICIES)),
)
def test_generated_model_conforms(conformance, spec: dict, init: str, composition: str, offload: str) -> None:
    cell = Cell(
        model="generated",
        init=init,
        composition=composition,
        tie="tied" if spec["ties"] else "untied",
        offload=offload,
        world_size=conformance.runner.session.nproc,
        spec=json.dumps(spec, sort_keys=True),
    )
    note(f"replay: {conformance.replay_line(cell)}")
    conformance.expect_all(cell)


def test_replay(conformance) -> None:
    """Collected only with --replay (see conformance/frontend/plugin.py)."""
    conformance.expect_all(conformance.runner.config.replay)

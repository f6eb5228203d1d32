"""Resharded resumes in the matrix: their ids, which cells can be one, and what each profile
carries (conformance/matrix/resharded.py)."""

from __future__ import annotations

import dataclasses

import pytest

from conformance.matrix import resharded
from conformance.matrix.axes import cell_from_axes, valid
from conformance.matrix.cells import Cell
from conformance.matrix.cost import expected_seconds
from conformance.matrix.profiles import cells
from fixtures.compositions import pairing
from fixtures.models import MODELS

RESUMED = Cell("mlp", "real", "jit_fsdp", scenario="resume", world_size=3, saved_at=2)


def test_the_id_names_both_world_sizes_and_the_axes_replay() -> None:
    assert RESUMED.id.endswith("-resume-ws2to3")
    assert RESUMED.axes()["saved_at"] == 2
    assert "saved_at" not in dataclasses.replace(RESUMED, saved_at=None).axes()
    assert cell_from_axes(RESUMED.axes()) == RESUMED


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"scenario": "train"}, "resume scenario's"),
        ({"composition": "jit_ddp"}, "takes no checkpoint to reshard"),
        ({"init": "meta_module_init"}, "init 'real' only"),
        ({"saved_at": 3}, "another world size"),
        ({"dtype": "bfloat16"}, "float32"),
        ({"simulated": True}, "simulated"),
    ],
)
def test_a_cell_that_cannot_reshard_is_refused_saying_why(change: dict, why: str) -> None:
    cell = dataclasses.replace(RESUMED, **change)
    assert why in (resharded.why_not(cell) or "")
    if not cell.simulated:
        with pytest.raises(ValueError, match="cannot resume resharded"):
            cell_from_axes(cell.axes())


def test_ci_resumes_to_more_and_to_fewer_ranks_under_thunders_fsdp_and_fsdp2() -> None:
    ci = [c for c in cells("ci", 2, {}) if c.saved_at is not None]
    assert ci == list(resharded.CI)
    assert {c.saved_at < c.world_size for c in ci} == {True, False}
    assert len({(c.saved_at, c.world_size) for c in ci}) >= 2
    assert {"jit_fsdp", "fsdp_jit", "thunderfx_fsdp2"} <= {c.composition for c in ci}
    assert all(resharded.why_not(c) is None for c in ci)


@pytest.mark.parametrize("profile", ["nightly", "full"])
def test_nightly_and_full_carry_every_pair_model_and_composition(profile: str) -> None:
    carried = {(c.composition, c.model, c.saved_at, c.world_size) for c in cells(profile, 2, {}) if c.saved_at}
    wanted = {
        (c, m, s, w)
        for c in resharded.COMPOSITIONS
        for m in resharded.MODELS
        for s, w in resharded.PAIRS
        if valid({"model": m, "composition": c, "tie": MODELS[m].ties[-1], "scenario": "resume"})
    }
    assert carried == wanted
    assert {c for c, *_ in carried} == set(resharded.COMPOSITIONS)


@pytest.mark.parametrize("refused", ["jit_fsdp", pairing("jit_fsdp", "default")])
@pytest.mark.parametrize("profile", ["ci", "nightly"])
def test_an_unsupported_composition_carries_no_resharded_cell(refused: str, profile: str) -> None:
    assert not [c for c in cells(profile, 2, {refused: "absent"}) if c.saved_at and c.composition == "jit_fsdp"]


def test_the_saving_world_is_charged_to_the_cells_expected_time() -> None:
    assert expected_seconds(RESUMED) > expected_seconds(dataclasses.replace(RESUMED, saved_at=None))

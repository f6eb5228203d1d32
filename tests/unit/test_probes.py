"""A probe tells an absence from a breakage: the Thunder under test lacking a module or name,
or refusing the call as its version does, makes a value unsupported (one stand-in cell, which
says why); a probe that raises otherwise (Thunder broke while setting the value up) leaves the
value offered, so that every cell of it runs and fails with Thunder's traceback."""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from conformance.frontend.blame import THUNDER, blame
from conformance.frontend.verdict import Conformance
from conformance.matrix.profiles import cells
from conformance.rank import build, probe
from conformance.world import protocol
from fixtures import compositions
from fixtures.compositions import COMPOSITIONS
from fixtures.probes import lacks
from tests.unit.test_runner_probe import StandInWorld, make_runner

CPU = torch.device("cpu")
LEGACY = "legacy_jit_fsdp"


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package on the path: ``fine`` (has ``API``), ``raising`` (raises while it imports) and
    ``broken_import`` (imports a module that does not exist)."""
    root = tmp_path / "probed_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "fine.py").write_text("API = 1\n")
    (root / "raising.py").write_text("raise RuntimeError('planted: broke while importing')\n")
    (root / "broken_import.py").write_text("import probed_pkg_dependency_that_is_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "probed_pkg"
    for name in [m for m in sys.modules if m.startswith("probed_pkg")]:
        del sys.modules[name]


def test_a_missing_module_or_symbol_is_an_absence(package: str) -> None:
    assert lacks(f"{package}.fine", "API") is None
    assert lacks(f"{package}.fine", "GONE") == f"Thunder's {package}.fine has no GONE"
    assert lacks(f"{package}.gone") == f"Thunder has no module {package}.gone"
    assert lacks(f"{package}_gone.sub", "API") == f"Thunder has no module {package}_gone"
    # the pin's own: DDP's transform is there, a name it never had is not
    assert lacks("thunder.distributed.transforms.ddp_v2", "DDPTransform") is None
    assert lacks("thunder.distributed", "no_such_api") == "Thunder's thunder.distributed has no no_such_api"


def test_a_module_that_raises_while_importing_is_no_absence(package: str) -> None:
    with pytest.raises(RuntimeError, match="planted: broke while importing"):
        lacks(f"{package}.raising", "API")
    # a module it imports is missing: the named module is there, and broke
    with pytest.raises(ModuleNotFoundError, match="probed_pkg_dependency_that_is_not_there"):
        lacks(f"{package}.broken_import", "API")


@pytest.fixture
def thunder_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thunder's ``fsdp`` raises inside Thunder (its own check that torch.distributed is
    there fails) before it would refuse the plain module: the legacy probe meets a breakage."""
    import torch.distributed

    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)


def test_the_pins_refusal_of_the_legacy_composition_is_an_absence() -> None:
    assert compositions._legacy_unsupported(CPU).startswith("thunder.distributed.fsdp(nn.Module) raises TypeError")


def test_a_probe_that_raises_inside_thunder_leaves_the_value_offered(
    thunder_breaks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RuntimeError) as raised:
        compositions._legacy_unsupported(CPU)
    assert blame(protocol.frames_of(raised.value)).owner == THUNDER
    # beside it, a composition whose probe finds the named symbol missing
    absent = dataclasses.replace(
        COMPOSITIONS["fsdp_jit"], name="absent", probe=lambda d: lacks("thunder.distributed", "no_such_transform")
    )
    monkeypatch.setitem(COMPOSITIONS, "absent", absent)
    monkeypatch.setattr(probe, "rank_device", lambda: CPU)
    found = probe.probe_compositions()
    assert found[LEGACY] is None  # offered: its cells run
    assert found["absent"] == "Thunder's thunder.distributed has no no_such_transform"


def test_the_cells_of_a_value_whose_probe_raised_run_and_fail_naming_it(thunder_breaks: None) -> None:
    # the probe answered None: the legacy composition is in the array, not one stand-in
    picked = [c for c in cells("ci", 2, {}) if c.composition == LEGACY]
    assert len(picked) > 1
    # each cell's build asks the probe again, inside the rank: it raises there, Thunder's
    cell = next(c for c in picked if c.executors == "default")
    with pytest.raises(RuntimeError) as raised:
        build.recipe(cell, CPU)
    frames = protocol.frames_of(raised.value)
    assert blame(frames).owner == THUNDER
    # as the rank loop answers it: the item fails (pytest's failure, not the kit's error) with
    # Thunder's traceback
    error = "Traceback (most recent call last):\n  ...\nRuntimeError: " + str(raised.value)
    failed = protocol.RankResult(0, protocol.FAILED, None, error, frames=frames)
    world = StandInWorld(2, None)
    runner = make_runner(world)
    runner.outcomes[cell.id] = types.SimpleNamespace(
        ok=False, results=[failed], culprits=lambda: [failed], describe=lambda names=None: f"[error]\n{error}"
    )
    node = types.SimpleNamespace(nodeid=f"conformance/test_numerics.py::test_numerics[{cell.id}]")
    with pytest.raises(pytest.fail.Exception) as verdict:
        Conformance(runner, node).expect(cell, "numerics", record=False)
    message = str(verdict.value)
    assert f"cell {cell.id} did not run to completion: Thunder raised at " in message
    assert "thunder/core/baseutils.py" in message.splitlines()[0] and "the kit broke" not in message
    assert "fsdp requires torch distributed to be available" in message


def test_the_plugins_apis_default_recipe_is_refused_as_a_pair_where_thunder_has_no_nvfuser() -> None:
    # on this CPU host Thunder has no nvFuser: the default recipe (recipe "auto") cannot run,
    # every executors value the cell names can, handed through BaseRecipe
    from fixtures.executors import EXECUTORS

    plugins = COMPOSITIONS["plugins_fsdp"]
    assert "nvFuser" in plugins.executors_probe(EXECUTORS["default"], CPU)
    assert plugins.executors_probe(EXECUTORS["torch_only"], CPU) is None
    # the refused pair keeps one stand-in, which says why; no array cell holds it, the
    # composition runs across the array with every other executors value
    # (the probe task asks the same of every composition that has an executors probe)
    pairs = compositions.pair_probes(lambda name: name not in ("nvfuser", LEGACY))
    refused = {pair: reason for pair, probe in pairs.items() if (reason := probe(CPU))}
    assert set(refused) == {compositions.pairing(c, "default") for c in ("plugins_fsdp", "plugins_ddp")}
    selected = cells("ci", 2, {"nvfuser": "no CUDA", LEGACY: "refused", **refused})
    paired = [c for c in selected if c.composition.startswith("plugins") and c.executors == "default"]
    assert sorted(c.composition for c in paired) == ["plugins_ddp", "plugins_fsdp"]
    assert sum(c.composition == "plugins_fsdp" for c in selected) > 3
    cell = paired[0]
    with pytest.raises(build.Unsupported, match="default recipe fuses with nvFuser"):
        build.recipe(cell, CPU)
    # where Thunder has nvFuser (a GPU host with its wheel) the default recipe runs across the array
    every = cells("ci", 2, {})
    assert sum(c.composition == "plugins_fsdp" and c.executors == "default" for c in every) > 1


def test_the_plugins_recipe_hands_thunder_exactly_the_cells_executors() -> None:
    from thunder.recipes import BaseRecipe

    how = compositions.Setup(CPU, None, {}, [], {"executors": ["torchcompile"]})
    recipe = compositions._recipe(how)
    assert isinstance(recipe, BaseRecipe) and recipe.executor_names == ["torchcompile"]
    assert compositions._recipe(dataclasses.replace(how, jit_options={})) == "auto"  # what a user gets
    marker = object()
    with_transforms = compositions._recipe(dataclasses.replace(how, jit_options={"executors": []}, transforms=[marker]))
    assert with_transforms.executor_names == [] and with_transforms.setup_transforms()[-1] is marker

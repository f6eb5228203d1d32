"""The composition probe's answers kept between runs (issue 58): a warm cache lists the cells
without a world, any change of what an answer depends on probes again, and a cache that
cannot be read or written never fails a run. The Runner's side with a stand-in world."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from conformance.frontend import options, probe_cache
from conformance.frontend.probing import PROBE
from conformance.matrix.profiles import cells
from tests.unit.test_runner_probe import LEGACY, StandInWorld, make_runner

KEY = {"thunder": {"version": "0.2.7"}, "backend": "gloo", "nproc": 2}


def test_answers_are_kept_per_key(tmp_path: Path) -> None:
    probe_cache.store(tmp_path, KEY, {"legacy_jit_fsdp": LEGACY})
    assert probe_cache.load(tmp_path, KEY) == {"legacy_jit_fsdp": LEGACY}
    assert probe_cache.load(tmp_path, {**KEY, "nproc": 3}) is None  # another key: probe again
    assert probe_cache.load(None, KEY) is None  # the cache off
    probe_cache.path(tmp_path, KEY).write_text("{not json")
    assert probe_cache.load(tmp_path, KEY) is None  # unreadable: probed again and written anew
    blocked = tmp_path / "file"
    blocked.write_text("")
    probe_cache.store(blocked, KEY, {})  # cannot be written: keeps nothing, raises nothing


def test_the_fingerprint_changes_with_thunders_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "thunder"
    package.mkdir()
    (package / "__init__.py").write_text("x = 1\n")
    monkeypatch.setattr(probe_cache.environment, "thunder_package", lambda: package)
    before = probe_cache.fingerprint("gloo", 2, [])
    assert probe_cache.fingerprint("gloo", 2, []) == before
    (package / "__init__.py").write_text("x = 22\n")  # a local checkout edited in place
    assert probe_cache.fingerprint("gloo", 2, [])["thunder"] != before["thunder"]
    assert probe_cache.fingerprint("nccl", 2, []) != probe_cache.fingerprint("gloo", 2, [])
    assert probe_cache.fingerprint("gloo", 3, []) != probe_cache.fingerprint("gloo", 2, [])
    assert probe_cache.fingerprint("nccl", 2, ["NVIDIA H100"]) != probe_cache.fingerprint("nccl", 2, ["NVIDIA H200"])
    monkeypatch.setenv("CC", "/opt/cc-that-was-not-there")  # a compiler a probe looks for, installed
    assert probe_cache.fingerprint("gloo", 2, []) != before


def test_a_warm_cache_picks_the_cells_without_a_world(tmp_path: Path) -> None:
    answer = {"fsdp_jit": None, "jit_fsdp": None, "legacy_jit_fsdp": LEGACY}
    cold_world = StandInWorld(2, answer)
    cold = make_runner(cold_world)
    cold.config = dataclasses.replace(cold.config, probe_cache=tmp_path)
    expected = cells("ci", 2, {"legacy_jit_fsdp": LEGACY})
    assert cold.cells == expected and cold_world.tasks == [PROBE] and cold.probe_cached is None
    warm_world = StandInWorld(2, answer)
    warm = make_runner(warm_world)
    warm.config = dataclasses.replace(warm.config, probe_cache=tmp_path)
    assert warm.cells == expected
    assert warm_world.tasks == []  # no task, so no world started
    assert warm.probe_cached is not None and json.loads(warm.probe_cached.read_text())["unsupported"] == {
        "legacy_jit_fsdp": LEGACY
    }


def test_a_probe_that_did_not_complete_is_never_kept(tmp_path: Path) -> None:
    world = StandInWorld(2, {}, ok=False)
    runner = make_runner(world)
    runner.config = dataclasses.replace(runner.config, probe_cache=tmp_path)
    assert runner.cells == [] and runner.probe_failure is not None
    assert not (tmp_path / "probes").exists() or not any((tmp_path / "probes").iterdir())


def test_the_option_names_a_folder_none_or_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(probe_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert options.parse_probe_cache("auto") == tmp_path / "thunder-conformance"
    assert options.parse_probe_cache("none") is None
    assert options.parse_probe_cache(str(tmp_path / "x")) == tmp_path / "x"
    monkeypatch.setenv(probe_cache.ENV, "none")
    assert options.parse_probe_cache("auto") is None
    monkeypatch.setenv(probe_cache.ENV, str(tmp_path / "y"))
    assert options.parse_probe_cache("auto") == tmp_path / "y"
    assert os.environ[probe_cache.ENV]

"""The pins live in pyproject.toml; tox.ini names torch and Thunder again so that pip resolves
them together. These tests keep the two in step."""

from __future__ import annotations

import configparser
import re
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from tests.support.suite_runs import ROOT


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["thunder"]
    return dict(r.split("==") for r in reqs if "==" in r)


def _tox_deps() -> list[str]:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return [line.strip() for line in tox["testenv"]["deps"].splitlines() if line.strip()]


def test_tox_default_thunder_is_the_pin() -> None:
    pins = _pyproject_pins()
    thunder = next(d for d in _tox_deps() if "THUNDER_SPEC" in d)
    default = re.fullmatch(r"\{env:THUNDER_SPEC:(.+)\}", thunder).group(1)
    assert default == f"lightning-thunder=={pins['lightning-thunder']}"


def test_tox_default_torch_is_the_pin() -> None:
    torch = next(d for d in _tox_deps() if "TORCH_SPEC" in d)
    default = re.fullmatch(r"\{env:TORCH_SPEC:(.+)\}", torch).group(1)
    assert default == f"torch=={_pyproject_pins()['torch']}"

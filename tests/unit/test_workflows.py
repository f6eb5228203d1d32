"""The GitHub workflows (.github/workflows): actionlint finds nothing in them, and every
command they run names something that exists here: tox envs in tox.ini, profiles in
PROFILES, modules that import, the pin the kit installs, the paths tox writes reports to.

actionlint comes with the dev extra (a wheel that carries the binary); it runs shellcheck on
every `run:` script where shellcheck is on PATH (as on GitHub's ubuntu runners)."""

from __future__ import annotations

import configparser
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conformance.matrix.profiles import PROFILES
from tests.support.suite_runs import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
NIGHTLY, PR = WORKFLOWS / "nightly.yml", WORKFLOWS / "pr.yml"
TOX = configparser.ConfigParser(interpolation=None)
TOX.read(ROOT / "tox.ini")
TOX_ENVS = {s.removeprefix("testenv:") for s in TOX.sections() if s.startswith("testenv:")}
PIN = re.search(r"\{env:THUNDER_SPEC:([^}]+)\}", TOX["testenv"]["deps"]).group(1)


def load(path: Path) -> dict[str, Any]:
    workflow = yaml.safe_load(path.read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as true
    return workflow


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def scripts(workflow: dict[str, Any]) -> list[str]:
    return [step["run"] for step in steps(workflow) if "run" in step]


def step(workflow: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in steps(workflow) if s.get("name") == name)


def test_actionlint_finds_nothing() -> None:
    # the venv's own binary: the dev extra installs it beside the interpreter running the tests
    actionlint = Path(sys.executable).parent / "actionlint"
    if not actionlint.exists():
        pytest.fail(f"{actionlint} is missing: install the kit's dev extra (pip install -e '.[dev]')")
    config = ROOT / ".github" / "actionlint.yaml"
    proc = subprocess.run(
        [str(actionlint), "-no-color", "-config-file", str(config), str(NIGHTLY), str(PR)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, ""), proc.stdout + proc.stderr


def test_actionlint_would_see_a_finding(tmp_path: Path) -> None:
    """The check above can fail: an undeclared runner label and a bad expression are found."""
    actionlint = Path(sys.executable).parent / "actionlint"
    if not actionlint.exists():
        pytest.fail(f"{actionlint} is missing: install the kit's dev extra (pip install -e '.[dev]')")
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on: push\njobs:\n  j:\n    runs-on: [self-hosted, tpu]\n    steps:\n      - run: echo ${{ matrix.x }}\n"
    )
    proc = subprocess.run([str(actionlint), "-no-color", str(bad)], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1 and '"tpu"' in proc.stdout and "matrix" in proc.stdout, proc.stdout


def _words(script: str) -> list[str]:
    """The script's words as the shell splits them (quotes, comments, `|`, `>`, `;` apart)."""
    lexer = shlex.shlex(script.replace("\\\n", " "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


@pytest.mark.parametrize("path", [NIGHTLY, PR], ids=lambda p: p.name)
def test_commands_name_what_exists(path: Path) -> None:
    named = {"tox": set(), "profile": set(), "module": set()}
    for script in scripts(load(path)):
        words = _words(script)
        for i, word in enumerate(words[:-1]):
            if word == "tox" and words[i + 1] == "-e":
                named["tox"].add(words[i + 2])
            elif word == "--profile":
                named["profile"].add(words[i + 1])
            elif word == "-m" and i and Path(words[i - 1]).name.startswith("python"):
                named["module"].add(words[i + 1])
            # a tox env's own interpreter, as .tox/ENV/bin/python
            elif m := re.fullmatch(r"\.tox/([^/]+)/bin/python", word):
                named["tox"].add(m.group(1))
    assert named["tox"] and named["tox"] <= TOX_ENVS, (named["tox"], TOX_ENVS)
    assert named["profile"] and named["profile"] <= set(PROFILES), named["profile"]
    for module in named["module"]:
        assert importlib.util.find_spec(module) is not None, module


def test_nightly_matrix_is_the_pin_main_the_newest_release_and_a_fork_from_a_variable() -> None:
    plan = "\n".join(scripts({"jobs": {"plan": load(NIGHTLY)["jobs"]["plan"]}}))
    specs = dict(re.findall(r'"name": "(\w+)", "spec": "([^"]+)"', plan))
    assert specs == {"pin": PIN, "main": "git+https://github.com/Lightning-AI/lightning-thunder@main"}, specs
    # the newest release is PyPI's, asked each night; a night PyPI does not answer runs without it
    assert "https://pypi.org/pypi/lightning-thunder/json" in plan and "name: \"release\"" in plan
    assert load(NIGHTLY)["jobs"]["conformance"]["env"]["TORCH_SPEC"] == "${{ matrix.torch }}"
    # the fork's spec comes from a repository variable, and only where it is set
    assert "vars.FORK_THUNDER_SPEC" in load(NIGHTLY)["jobs"]["plan"]["steps"][0]["env"]["FORK"]
    assert 'if [ -n "$FORK" ]' in plan
    job = load(NIGHTLY)["jobs"]["conformance"]
    assert job["runs-on"] == ["self-hosted", "linux", "gpu"]
    assert job["env"]["THUNDER_SPEC"] == "${{ matrix.spec }}"
    assert job["strategy"]["fail-fast"] is False
    assert "tox -e multigpu -- --profile nightly" in "\n".join(scripts(load(NIGHTLY)))
    assert {"schedule", "workflow_dispatch"} <= set(load(NIGHTLY)["on"])


def test_the_paths_are_those_tox_writes() -> None:
    """reports/ and reports/junit.xml are where tox.ini points the suite (so they are what
    the workflows upload, summarize, compare and publish)."""
    for env in ("conformance", "multigpu"):
        command = TOX[f"testenv:{env}"]["commands"]
        assert (
            "--report-dir {tox_root}{/}reports" in command and "--junitxml {tox_root}{/}reports{/}junit.xml" in command
        )
    nightly = load(NIGHTLY)
    upload = step(nightly, "Upload reports")
    download = step(nightly, "Download the previous night's reports")
    assert upload["with"]["path"] == "reports/" and download["with"]["name"] == upload["with"]["name"]
    assert download["with"]["workflow"] == NIGHTLY.name
    assert step(nightly, "Publish the JUnit report")["with"]["report_paths"] == "reports/junit.xml"
    assert "conformance.compare previous reports" in step(nightly, "Compare with the previous night")["run"]
    assert step(load(PR), "Upload reports")["with"]["path"] == "reports/"


@pytest.mark.parametrize("path", [NIGHTLY, PR], ids=lambda p: p.name)
def test_every_job_is_bounded_and_reports_survive_a_failure(path: Path) -> None:
    workflow = load(path)
    for name, job in workflow["jobs"].items():
        assert 0 < job["timeout-minutes"] <= 360, name
    for s in steps(workflow):
        if s.get("name") in {"Upload reports", "Summary", "Publish the JUnit report"}:
            assert s["if"].startswith("always()"), s
        if "run" in s and "GITHUB_STEP_SUMMARY" in s["run"] and "summary.md" in s["run"]:
            assert s["if"].startswith("always()"), s


def test_pr_runs_smoke_then_the_fast_kit_tests_on_cpu() -> None:
    pr = load(PR)
    job = pr["jobs"]["cpu"]
    assert job["runs-on"] == "ubuntu-latest" and "pull_request" in pr["on"]
    assert step(pr, "Kit tests (not slow)")["run"] == 'tox -e tests -- -m "not slow"'
    assert step(pr, "Conformance suite, smoke profile (gloo)")["run"] == "tox -e conformance -- --profile smoke"
    setup = next(s for s in steps(pr) if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["python-version"] == "3.11"


def test_shellcheck_is_used_where_present() -> None:
    """A note more than a check: without shellcheck actionlint skips the scripts' shell."""
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not on PATH: actionlint checked the workflows without it")


def test_nightly_uploads_the_pages_and_names_them_in_the_summary() -> None:
    """report.html and the dashboard over the previous night and tonight go up as their own
    artifact, whatever the suite's status, and the job summary says where they are."""
    nightly = load(NIGHTLY)
    pages, upload = step(nightly, "Pages"), step(nightly, "Upload pages")
    assert pages["if"].startswith("always()") and upload["if"].startswith("always()")
    assert "python -m conformance.dashboard nights --out dashboard" in pages["run"]
    assert set(upload["with"]["path"].split()) == {"reports/report.html", "dashboard/"}
    summary = pages["run"].split("GITHUB_STEP_SUMMARY")[0]
    assert upload["with"]["name"].replace("${{ matrix.name }}", "") in summary
    assert "reports/report.html" in summary and "dashboard/index.html" in summary
    names = [s.get("name") for s in steps(nightly)]
    assert names.index("Compare with the previous night") < names.index("Pages") < names.index("Upload pages")


def test_a_scheduled_job_runs_the_kits_slow_tests() -> None:
    """The planted bugs (the proof that every check fails) run every night, which pull
    requests leave out."""
    nightly = load(NIGHTLY)
    job = nightly["jobs"]["kit-slow-tests"]
    assert job["runs-on"] == "ubuntu-latest" and "schedule" in nightly["on"]
    assert step({"jobs": {"k": job}}, "Kit tests (slow)")["run"].startswith("tox -e tests -- -m slow")

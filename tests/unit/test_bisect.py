"""python -m conformance.bisect: a step's report.json maps to git bisect's good, bad or skip;
bad input ends with one line and exit status 4; and (slow) a Thunder history built from the
pinned sources, one commit of which plants a gradient bug, is bisected to exactly that commit."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conformance.bisect.classify import BAD, GOOD, SKIP, Verdict, verdict
from conformance.bisect.cli import BAD_INPUT, FOUND, Options, bisect, main
from conformance.bisect.git import BadInput
from conformance.bisect.step import StepConfig, WrongThunder, check_thunder_resolves, run_step, step_environment
from tests.support.suite_runs import ROOT

CELL = "mlp-real-fsdp_jit-untied-none-zero2-none-float32-ws2"  # smoke profile: the cheapest cell
OTHER = "tied_lm-meta_module_init-jit_fsdp-tied-all-zero2-none-float32-ws2"


def _item(area: str, outcome: str, cell: str = CELL, **extra: Any) -> dict[str, Any]:
    ranks = [{"rank": r, "status": "passed", "failures": []} for r in range(2)]
    return {
        "id": f"conformance/test_{area}.py::test_{area}[{cell}]",
        "cell": cell,
        "area": area,
        "outcome": outcome,
        "ranks": ranks,
        **extra,
    }


def _report(*items: dict[str, Any], exit_status: int = 0) -> dict[str, Any]:
    return {"exit_status": exit_status, "cells": list(items)}


FAILED = _item(
    "numerics",
    "failed",
    message=f"{CELL} does not conform (numerics):\n  ranks [0, 1]: gradients at step 0 (SGD) [fc1.weight]",
    ranks=[{"rank": r, "status": "failed", "failures": ["gradients at step 0 (SGD) [fc1.weight]"]} for r in range(2)],
)
STALE = _item(
    "collectives",
    "failed",
    message=f"{CELL} conforms (collectives), but xfails entries cover it:\n  xfails.toml:3: stale: ...",
)


@pytest.mark.parametrize(
    ("report", "code", "says"),
    [
        (_report(_item("numerics", "passed"), _item("memory", "passed")), GOOD, "2 items conform"),
        (_report(_item("numerics", "passed"), _item("collectives", "xfailed")), GOOD, "conform"),
        (_report(_item("numerics", "passed"), STALE, exit_status=1), GOOD, "conform"),
        (_report(_item("memory", "passed"), FAILED, exit_status=1), BAD, "1 of 2 items failed: numerics"),
        (_report(FAILED, _item("memory", "error"), exit_status=1), BAD, "failed"),
        (_report(_item("numerics", "passed"), _item("memory", "error"), exit_status=1), SKIP, "error"),
        (_report(_item("numerics", "unsupported")), SKIP, "unsupported"),
        (_report(exit_status=2), SKIP, "exit status 2"),
        (_report(_item("numerics", "passed"), exit_status=2), SKIP, "interrupt"),
        (_report(exit_status=5), SKIP, f"no item matched {CELL}"),
        (_report(_item("numerics", "failed", cell=OTHER), exit_status=1), SKIP, "no item matched"),
        (None, SKIP, "no report.json"),
    ],
    ids=[
        "passed",
        "xfailed-conforms",
        "stale-entry-conforms",
        "failed",
        "failed-beats-error",
        "error",
        "unsupported",
        "collection-error",
        "interrupted",
        "nothing-selected",
        "another-cell-failed",
        "no-report",
    ],
)
def test_a_report_maps_to_a_step_exit_status(report: dict[str, Any] | None, code: int, says: str) -> None:
    found = verdict(report, CELL)
    assert found.code == code and says in found.reason, found
    assert found.nothing_selected == ("no item matched" in says)
    if code == BAD:
        assert found.failed_ids == (FAILED["id"],) and "gradients at step 0" in found.failures[0]


def test_an_item_whose_fixture_broke_is_still_the_cells() -> None:
    # an error before the cell ran leaves the record without "cell"/"area": the node id names both
    broken = {"id": f"conformance/test_memory.py::test_memory[{CELL}]", "outcome": "error"}
    assert verdict(_report(broken, exit_status=1), CELL).code == SKIP
    assert verdict(_report(broken, _item("numerics", "passed"), exit_status=1), CELL, "numerics").code == 0


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=kit", "-c", "user.email=kit@example.com", "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def toy_repo(tmp_path: Path) -> Path:
    """A git repository with a (stand-in) thunder package at its root and two commits."""
    repo = tmp_path / "repo"
    (repo / "thunder").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "thunder" / "__init__.py").write_text("")
    _commit(repo, "first")
    (repo / "thunder" / "__init__.py").write_text("# second\n")
    _commit(repo, "second")
    return repo


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--thunder-repo", "{tmp}", "--good", "HEAD~1", "--bad", "HEAD", CELL], "not a git repository"),
        (["--thunder-repo", "{tmp}/nowhere", "--good", "HEAD~1", "--bad", "HEAD", CELL], "no such directory"),
        (["--thunder-repo", "{repo}", "--good", "v0.0.0", "--bad", "HEAD", CELL], "--good v0.0.0: no such commit"),
        (["--thunder-repo", "{repo}", "--good", "HEAD~1", "--bad", "nobranch", CELL], "--bad nobranch: no such"),
        (["--thunder-repo", "{repo}", "--good", "HEAD~1", "--bad", "HEAD", "mlp real"], "is not a cell id"),
        (["--thunder-repo", "{repo}", "--good", "HEAD~1", "--bad", "HEAD", CELL, "--area", "speed"], "--area speed"),
        (["--thunder-repo", "{repo}", "--good", "HEAD~1", CELL], "the following arguments are required: --bad"),
    ],
    ids=["not-a-repo", "no-directory", "unknown-good", "unknown-bad", "not-a-cell-id", "unknown-area", "no-bad"],
)
def test_bad_input_is_one_line_and_exit_4(
    toy_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    outside = tmp_path / "plain"
    outside.mkdir()
    argv = [a.format(tmp=outside, repo=toy_repo) for a in args]
    status, err = _main(capsys, *argv)
    assert status == BAD_INPUT and says in err and err.startswith("ERROR: ") and err.count("\n") == 1, err


def test_a_checkout_mid_bisect_or_with_changes_is_refused(toy_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--thunder-repo", str(toy_repo), "--good", "HEAD~1", "--bad", "HEAD", CELL]
    (toy_repo / "thunder" / "__init__.py").write_text("# edited\n")
    status, err = _main(capsys, *argv)
    assert status == BAD_INPUT and f"{toy_repo} has uncommitted changes" in err
    _git(toy_repo, "checkout", "-q", "--", ".")
    _git(toy_repo, "bisect", "start")
    status, err = _main(capsys, *argv)
    assert status == BAD_INPUT and "in the middle of a git bisect already" in err
    assert (toy_repo / ".git" / "BISECT_START").exists(), "the user's own bisect is left alone"


def _options(repo: Path, state: Path) -> Options:
    config = StepConfig(cell_id=CELL, profile="smoke", state_dir=str(state))
    return Options(
        repo=repo, good=_git(repo, "rev-parse", "HEAD~1"), bad=_git(repo, "rev-parse", "HEAD"), config=config
    )


@pytest.mark.parametrize(
    ("at_good", "at_bad", "says"),
    [
        (
            Verdict(SKIP, "no item matched", nothing_selected=True),
            None,
            f"{CELL} matches no item of the smoke profile at --good",
        ),
        (Verdict(BAD, "1 of 5 items failed", 5), None, "does not conform at --good"),
        (Verdict(GOOD, "5 items conform", 5), Verdict(GOOD, "ok", 5), "conforms at --bad"),
        (Verdict(SKIP, "pytest exit status 2: a collection error", 0), None, "cannot tell whether"),
        (Verdict(SKIP, "the kit cannot tell: items error", 5), None, "cannot tell whether"),
    ],
    ids=["matches-nothing", "good-fails", "bad-conforms", "collection-error", "cannot-tell"],
)
def test_the_premise_is_checked_before_bisecting(
    toy_repo: Path, tmp_path: Path, at_good: Verdict, at_bad: Verdict | None, says: str
) -> None:
    options = _options(toy_repo, tmp_path)
    seen: list[tuple[str, bool]] = []

    def step(config: StepConfig, tree: Path, commit: str) -> Verdict:
        # each end is judged in an exported copy of its tree, never in the user's checkout
        seen.append((commit, tree != toy_repo and (tree / "thunder" / "__init__.py").is_file()))
        return at_good if commit == options.good else at_bad

    with pytest.raises(BadInput) as raised:
        bisect(options, step=step)
    assert says in str(raised.value)
    assert all(exported for _, exported in seen) and seen[0][0] == options.good
    assert not (toy_repo / ".git" / "BISECT_START").exists()


def test_good_right_before_bad_needs_no_step(toy_repo: Path, tmp_path: Path) -> None:
    options = _options(toy_repo, tmp_path)
    failing = Verdict(BAD, "1 of 5 failed", 5, failures=("it failed",), failed_ids=("x::y",))

    def step(config: StepConfig, tree: Path, commit: str) -> Verdict:
        found = Verdict(GOOD, "conform", 5) if commit == options.good else failing
        (tmp_path / commit).mkdir()
        (tmp_path / commit / "verdict.json").write_text(json.dumps(dataclasses.asdict(found)))
        return found

    result = bisect(options, step=step)
    assert result.status == FOUND
    assert result.lines[0] == f"first bad commit: {options.bad} second"
    assert "it failed" in result.lines and result.lines[-1].startswith("repro: ")
    assert _git(toy_repo, "status", "--porcelain") == "" and not (toy_repo / ".git" / "BISECT_START").exists()


def test_a_thunder_found_elsewhere_is_refused(toy_repo: Path, tmp_path: Path) -> None:
    config = StepConfig(cell_id=CELL, profile="smoke", state_dir=str(tmp_path))
    env = step_environment(config, toy_repo)
    check_thunder_resolves(config, toy_repo, env)  # the checkout's root first: found there
    env["PYTHONPATH"] = str(tmp_path)  # the checkout left off: the installed Thunder answers
    with pytest.raises(WrongThunder, match=r"import thunder in a rank would load .*site-packages"):
        check_thunder_resolves(config, toy_repo, env)


def test_an_end_without_a_thunder_package_is_bad_input(toy_repo: Path, tmp_path: Path) -> None:
    _git(toy_repo, "rm", "-q", "-r", "thunder")
    _commit(toy_repo, "thunder moved")
    options = _options(toy_repo, tmp_path)  # --bad is the commit without it
    conforms = Verdict(GOOD, "5 items conform", 5)
    with pytest.raises(BadInput, match=r"--bad \w{12} has no thunder/__init__.py at its root"):
        bisect(
            options,
            step=lambda config, tree, commit: run_step(config, tree, commit) if commit == options.bad else conforms,
        )


# The planted regression: FSDP's reduce-scatter divides the gradient by the world size twice.
AVERAGED = "    preaverage_grad = grad / group.size()\n"
PLANTED = "    preaverage_grad = grad / group.size() / group.size()\n"


def _thunder_history(repo: Path) -> dict[str, str]:
    """Three commits of the pinned Thunder's sources: import, a harmless one, the bug."""
    import thunder

    shutil.copytree(Path(thunder.__file__).parent, repo / "thunder", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".gitignore").write_text("__pycache__/\n")
    _git(repo, "init", "-q")
    commits = {"import": _commit(repo, "Import the pinned Thunder's sources")}

    def edit(path: str, old: str | None, new: str, message: str) -> str:
        file = repo / "thunder" / path
        text = file.read_text()
        if old is None:  # a harmless edit: a comment at the end
            file.write_text(text + new)
        else:
            assert text.count(old) == 1, f"{path} changed: plant the bug elsewhere"
            file.write_text(text.replace(old, new))
        return _commit(repo, message)

    commits["comment"] = edit("__init__.py", None, "# a harmless comment\n", "A comment in thunder/__init__.py")
    prims = "distributed/prims.py"
    commits["bug"] = edit(prims, AVERAGED, PLANTED, "distributed: average gradients before the reduce-scatter")
    return commits


@pytest.mark.slow  # three suite runs, a world each: both ends, then one step of git bisect run
def test_bisect_names_the_commit_that_planted_the_bug(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commits = _thunder_history(repo)
    branch = _git(repo, "rev-parse", "--abbrev-ref", "HEAD")
    started = time.monotonic()
    ends = ["--good", commits["import"], "--bad", branch]
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.bisect", "--thunder-repo", str(repo), *ends, "--profile", "smoke", CELL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    print(f"bisect took {time.monotonic() - started:.0f} s\n{output}")
    assert proc.returncode == FOUND, output
    assert f"first bad commit: {commits['bug']} distributed: average gradients before the reduce-scatter" in output
    assert "does not conform (numerics)" in output and "gradients at step 0 (SGD)" in output
    repro = next(line for line in output.splitlines() if line.startswith("repro: "))
    assert f"checkout {commits['bug']}" in repro and f"PYTHONPATH={repo}" in repro
    assert f"test_numerics[{CELL}]" in repro
    # the ranks ran the checkout's Thunder: the installed one has no bug for --bad to fail on (and a
    # step aborts where import thunder would resolve elsewhere); git bisect is over
    assert "step " in output and "abort" not in output.lower()
    assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == branch
    assert _git(repo, "status", "--porcelain") == "" and not (repo / ".git" / "BISECT_START").exists()

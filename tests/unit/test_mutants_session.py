"""Mutation analysis's session and command line without a world: resuming (here and from an
earlier analysis's record), forgetting one outcome, the lines a commit range changed,
``--diff`` and ``--operators``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
from pathlib import Path

from conformance.mutants import __main__ as cli
from conformance.mutants import report, sites, trial
from conformance.mutants.__main__ import main
from conformance.mutants.kills import KIT_ERROR, SILENT, SURVIVED, Verdict
from conformance.mutants.operators import KEPT_RUNNING, NAMES
from conformance.mutants.overlay import installed_thunder
from conformance.mutants.store import Session
from conformance.reports.changed_lines import from_unified_diff
from conformance.reports.coverage_map import CoverageMap, file_lines
from tests.support.fake_thunder import SOURCE, fake_thunder


def test_the_session_resumes_with_what_it_has_not_judged(tmp_path: Path) -> None:
    every = list(sites.sites("thunder/distributed/utils.py", SOURCE))[:3]
    session = Session(tmp_path / "s.sqlite")
    assert session.add(every) == 3
    session.record(every[0], Verdict(SILENT, 1, "c", ("numerics",), "found", 3.0), "diff")
    session.close()
    again = Session(tmp_path / "s.sqlite")
    assert again.add(every) == 0
    assert [m.id for m in again.pending()] == sorted(m.id for m in every[1:])
    [(mutant, verdict, diff)] = again_judged = again.judged()
    assert mutant == every[0] and verdict.areas == ("numerics",) and diff == "diff"
    again.close()
    # on a fresh machine, from the record an earlier one wrote: its verdicts stand, but not
    # its kit errors or equivalents (each judged again), nor one about another source
    fresh = Session(tmp_path / "fresh.sqlite")
    fresh.add(every)
    record = report.build([(mutant, verdict, diff)], {}, CoverageMap("0", {}, {}, (), {}))["mutants"]
    other = {**record[0], "id": every[1].id.replace("@", "@0"), "outcome": SURVIVED}
    kit, equal = ({"id": every[i].id, "outcome": o} for i, o in ((1, KIT_ERROR), (2, "equivalent")))
    assert fresh.adopt([*record, other, kit, equal, "not an entry"]) == 1
    assert fresh.judged() == again_judged and len(fresh.pending()) == 2
    fresh.close()


def test_changed_lines_are_the_new_sides_lines() -> None:
    diff = (
        "--- a/thunder/distributed/utils.py\n+++ b/thunder/distributed/utils.py\n"
        "@@ -10 +10,3 @@ def f():\n-x\n+y\n+z\n+w\n"
        "@@ -40 +41,0 @@\n-gone\n"
        "--- a/thunder/old.py\n+++ /dev/null\n@@ -1,3 +0,0 @@\n-a\n-b\n-c\n"
    )
    assert from_unified_diff(diff) == {"thunder/distributed/utils.py": {10, 11, 12, 41}}
    old = {"thunder/distributed/utils.py": {10, 40}, "thunder/old.py": {1, 2, 3}}
    assert from_unified_diff(diff, side="old") == old


def test_context_lines_touch_nothing() -> None:
    """git diff's and diff -u's three lines of context around a change are not the change; a
    removed line that reads like a header ("-- x" removed is "--- x") is still a body line."""
    diff = (
        "--- a/thunder/distributed/transforms/fsdp_v2.py\n+++ b/thunder/distributed/transforms/fsdp_v2.py\n"
        "@@ -216,7 +216,8 @@\n c1\n c2\n c3\n--- x\n+y\n+z\n c5\n c6\n c7\n"
        "@@ -300,3 +301,4 @@\n c\n+inserted\n c\n c\n"
    )
    path = "thunder/distributed/transforms/fsdp_v2.py"
    assert from_unified_diff(diff, side="old") == {path: {219, 300, 301}}
    assert from_unified_diff(diff) == {path: {219, 220, 302}}


def test_diff_lists_only_the_mutants_on_the_lines_a_commit_range_changed(tmp_path: Path, capsys) -> None:
    """A two-commit history of Thunder's utils.py whose second commit is the installed file:
    ``--diff A..B`` lists the mutants of the lines B changed, and nothing else."""
    path = "thunder/distributed/utils.py"
    installed = (installed_thunder() / path).read_text()
    lines = installed.splitlines(keepends=True)
    every = list(sites.sites(path, installed))
    changed = next(m.line for m in every if m.function and m.line == m.end_line) - 1  # one line, in a function
    before = "".join([*lines[:changed], lines[changed].rstrip("\n") + "  # as it was in A\n", *lines[changed + 1 :]])
    repo = tmp_path / "thunder-repo"
    (repo / "thunder" / "distributed").mkdir(parents=True)

    def git(*args: str) -> str:
        env = {
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        }
        return subprocess.run(
            ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
        ).stdout

    git("init", "-q")
    for text, message in ((before, "A"), (installed, "B")):
        (repo / path).write_text(text)
        git("add", "-A")
        git("commit", "-qm", message)
    a, b = git("rev-list", "--reverse", "HEAD").split()
    cmap = CoverageMap("0", {path: file_lines(installed_thunder() / path)}, {}, (), {})
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "coverage-map.json").write_text(json.dumps(cmap.to_json()))
    args = ["--map", str(tmp_path / "map"), "--files", path, "--thunder-repo", str(repo), "--list"]
    assert main([*args, "--diff", f"{a}..{b}", "--out", str(tmp_path / "m")]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    expected = sorted(m.id for m in every if changed + 1 in m.lines)
    assert listed and sorted(listed) == expected
    assert main([*args, "--diff", f"{b}..{a}", "--out", str(tmp_path / "m")]) == 4  # B is not the installed source


def test_a_session_forgets_the_verdicts_of_one_outcome(tmp_path: Path) -> None:
    every = list(sites.sites("thunder/distributed/utils.py", SOURCE))[:2]
    session = Session(tmp_path / "s.sqlite")
    session.add(every)
    session.record(every[0], Verdict(KIT_ERROR), "")
    session.record(every[1], Verdict(SURVIVED), "")
    assert session.forget(KIT_ERROR) == 1
    assert [m.id for m in session.pending()] == [every[0].id]
    assert [v.outcome for _, v, _ in session.judged()] == [SURVIVED]
    session.close()


def test_kept_running_names_the_operators_that_tend_to_keep_thunder_running(tmp_path: Path, capsys) -> None:
    """``--operators kept-running`` expands to the preset; the four left out are those whose
    mutants mostly make Thunder raise or delete a check that always holds, and the two
    negations added after its census; ``all`` takes them too."""
    assert set(NAMES) - set(KEPT_RUNNING) == {
        "core/AddNot",
        "core/ReplaceTrueWithFalse",
        "core/ReplaceFalseWithTrue",
        "kit/DeleteCallStatement",
        "core/ReplaceUnaryOperator_Delete_Not",
        "kit/ReverseMembership",
    }
    path = "thunder/distributed/utils.py"
    cmap = CoverageMap("0", {path: file_lines(installed_thunder() / path)}, {}, (), {})
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "coverage-map.json").write_text(json.dumps(cmap.to_json()))
    args = ["--map", str(tmp_path / "map"), "--files", path, "--list", "--out", str(tmp_path / "m")]
    assert main([*args, "--operators", "kept-running"]) == 0
    listed = {line.split()[0].split(":")[2].split("#")[0] for line in capsys.readouterr().out.splitlines()}
    assert listed and listed <= set(KEPT_RUNNING)
    assert main([*args, "--operators", "all"]) == 0
    every = {line.split()[0].split(":")[2].split("#")[0] for line in capsys.readouterr().out.splitlines()}
    assert every > listed and "kit/ReverseMembership" in every


def test_sigterm_stops_the_analysis_as_ctrl_c_does(tmp_path: Path, monkeypatch) -> None:
    """SIGTERM inside a trial: the trial unwinds (its file in the overlay restored), nothing is
    recorded for it, and the analysis says it stopped (exit status 130 from main)."""
    root = fake_thunder(tmp_path)
    path = "thunder/distributed/utils.py"
    mutant = next(iter(sites.sites(path, SOURCE)))

    def killed_inside(m, overlay, plan, folder):
        with overlay.applied(m, m.mutated(SOURCE)):
            os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the trial")

    monkeypatch.setattr(trial, "run", killed_inside)
    session = Session(tmp_path / "s.sqlite")
    session.add([mutant])
    args = argparse.Namespace(out=tmp_path / "m", suite_args=[], trial_timeout=60.0)
    cmap = CoverageMap("0", {path: file_lines(root / path)}, {}, (), {})
    before = signal.getsignal(signal.SIGTERM)
    assert cli.judge([mutant], session, {}, cmap, root, args) is True
    assert (tmp_path / "m" / "overlay" / path).read_text() == SOURCE
    assert session.judged() == [] and [m.id for m in session.pending()] == [mutant.id]
    assert signal.getsignal(signal.SIGTERM) is before
    session.close()

"""Mutation analysis (conformance/mutants/) without a world: operators, mutant ids and samples,
the equivalents file, the overlay, verdicts read off reports, scores, the resumable session."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from cosmic_ray.mutating import mutate_code

from conformance.mutants import equivalents, report, sites, trial
from conformance.mutants.operators import KIT, NAMES
from conformance.mutants.overlay import Overlay, installed_thunder
from conformance.mutants.store import Session
from conformance.mutants.verdict import (
    INCOMPETENT,
    KIT_ERROR,
    NOT_COVERED,
    RAISED,
    SILENT,
    SURVIVED,
    TIMEOUT,
    Verdict,
    classify,
)
from conformance.reports.changed_lines import from_unified_diff
from conformance.reports.coverage_map import CellLines, CoverageMap, file_lines

SOURCE = "LIMIT = 1\nassert LIMIT == 1\n\n\ndef pad(rows, world):\n    return [rows, world][0] + LIMIT\n"


@pytest.mark.parametrize("name", sorted(KIT))
def test_the_kits_operators_make_what_their_examples_say(name: str) -> None:
    for example in KIT[name].examples():
        assert mutate_code(example.pre_mutation_code, KIT[name](), example.occurrence) == example.post_mutation_code


def test_a_mutant_id_names_its_source_and_a_sample_is_the_same_for_a_seed() -> None:
    every = list(sites.sites("thunder/distributed/utils.py", SOURCE))
    assert {"core/NumberReplacer", "kit/DropListEntry"} <= {m.operator for m in every}
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    assert all(m.id.startswith(f"thunder/distributed/utils.py@{digest}:") for m in every)
    assert len({m.id for m in every}) == len(every)
    assert sites.sample(every, 3, seed=7) == sites.sample(every, 3, seed=7) == sites.sample(every, 5, seed=7)[:3]
    assert sorted(sites.sample(every, None, seed=7), key=lambda m: m.id) == sorted(every, key=lambda m: m.id)
    dropped = next(m for m in every if m.operator == "kit/DropListEntry")
    assert dropped.function == "pad" and "[world][0]" in (dropped.mutated(SOURCE) or "")
    assert all(n in NAMES for n in {m.operator for m in every})


def test_an_equivalents_entry_must_name_a_mutant_of_this_source_and_say_why(tmp_path: Path) -> None:
    every = list(sites.sites("thunder/distributed/utils.py", SOURCE))
    file = tmp_path / "eq.toml"
    file.write_text(f'[[equivalent]]\nmutant = "{every[0].id}"\nwhy = "a constant nobody reads"\n')
    assert set(equivalents.load(file, every)) == {every[0].id}
    gone = every[0].id.replace(f":{every[0].line}:", ":999:")
    file.write_text(f'[[equivalent]]\nmutant = "{gone}"\nwhy = "x"\n')
    with pytest.raises(equivalents.EquivalentsError, match="names no mutant of this source"):
        equivalents.load(file, every)
    file.write_text(f'[[equivalent]]\nmutant = "{every[0].id}"\n')
    with pytest.raises(equivalents.EquivalentsError, match="gives no reason"):
        equivalents.load(file, every)
    other = every[0].id.replace(every[0].source, "0" * 12)  # another Thunder's source: not this one's
    file.write_text(f'[[equivalent]]\nmutant = "{other}"\nwhy = "x"\n')
    assert equivalents.load(file, every) == {}


def test_an_equivalence_on_some_devices_sets_a_mutant_aside_only_there(tmp_path: Path) -> None:
    every = list(sites.sites("thunder/distributed/utils.py", SOURCE))
    file = tmp_path / "eq.toml"
    file.write_text(
        f'[[equivalent]]\nmutant = "{every[0].id}"\nwhy = "a CPU tensor moved to the CPU"\ndevices = ["cpu"]\n'
    )
    assert set(equivalents.load(file, every, "cpu")) == {every[0].id}
    assert equivalents.load(file, every, "cuda") == {}  # there its trial judges it
    data = report.build(
        [(every[0], Verdict(SURVIVED), "")], equivalents.load(file, every, "cpu"), CoverageMap("0", {}, {}, (), {})
    )
    assert data["mutants"][0]["equivalent_on"] == ["cpu"] and "(on cpu only)" in report.markdown(data)
    file.write_text(f'[[equivalent]]\nmutant = "{every[0].id}"\nwhy = "x"\ndevices = ["tpu"]\n')
    with pytest.raises(equivalents.EquivalentsError, match="'devices' must list some of cpu, cuda"):
        equivalents.load(file, every)
    # the trials' device, as the suite resolves its backend: gloo's ranks are on the CPU
    assert trial.device(("--backend", "gloo", "--nproc", "2")) == "cpu"
    assert trial.device(("--backend", "nccl")) == trial.device(("--nproc", "gpus")) == "cuda"


def _digest_tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def test_the_overlay_never_writes_into_the_installed_thunder(tmp_path: Path) -> None:
    installed = installed_thunder()
    before = _digest_tree(installed / "thunder" / "distributed")
    overlay = Overlay(tmp_path / "overlay", installed)
    path = "thunder/distributed/utils.py"
    text = (installed / path).read_text()
    mutant = next(sites.sites(path, text, ["core/NumberReplacer"]))
    mutated = mutant.mutated(text)
    assert mutated is not None and mutated != text
    with overlay.applied(mutant, mutated) as target:
        assert target.read_text() == mutated
        assert overlay.environment()["PYTHONPATH"].split(":")[0] == str(tmp_path / "overlay")
    assert (tmp_path / "overlay" / path).read_text() == text  # restored
    assert _digest_tree(installed / "thunder" / "distributed") == before


def _fake_thunder(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "thunder" / "distributed").mkdir(parents=True)
    (root / "thunder" / "__init__.py").write_text("")
    (root / "thunder" / "distributed" / "__init__.py").write_text("")
    (root / "thunder" / "distributed" / "utils.py").write_text(SOURCE)
    return root


def test_a_mutant_that_breaks_the_import_is_incompetent_not_a_kill(tmp_path: Path) -> None:
    root = _fake_thunder(tmp_path)
    path = "thunder/distributed/utils.py"
    lines = file_lines(root / path)
    cmap = CoverageMap("0", {path: lines}, {"c": CellLines({path: (6,)}, 1.0, 2, False)}, (), {})
    # LIMIT = 2 fails the module's own assert on import: no cell could say anything
    mutant = next(m for m in sites.sites(path, SOURCE, ["core/NumberReplacer"]) if m.line == 1)
    assert trial.cells_for(mutant, cmap) == ["c"]  # an import-time line: every cell
    verdict, diff = trial.run(mutant, Overlay(tmp_path / "overlay", root), trial.Plan(cmap, tmp_path), tmp_path / "t")
    assert verdict.outcome == INCOMPETENT and "AssertionError" in verdict.detail
    assert "-LIMIT = 1" in diff and "+LIMIT = 2" in diff
    assert report.score([verdict]).to_json() == {
        "counts": {INCOMPETENT: 1},
        "run": 0,
        "kept_running": 0,
        "silently_wrong": 0,
        "silent_score": None,
        "plain_score": None,
    }
    unrun = next(m for m in sites.sites(path, SOURCE, ["core/NumberReplacer"]) if m.line == 6)
    assert trial.cells_for(unrun, CoverageMap("0", {path: lines}, {}, (), {})) == []


def _item(cell: str, area: str, outcome: str, message: str = "", statuses: tuple[str, ...] = ()) -> dict:
    return {
        "cell": cell,
        "area": area,
        "outcome": outcome,
        "message": message,
        "ranks": [{"rank": i, "status": s} for i, s in enumerate(statuses)],
    }


def test_verdicts_read_off_the_report() -> None:
    conform = [_item("a", "numerics", "passed"), _item("a", "memory", "xfailed")]
    assert classify({"cells": conform}, 1.0).outcome == SURVIVED
    found = "b does not conform (numerics):\n  ranks [0, 1]: gradients at step 1 [w]: off by 1%"
    v = classify({"cells": [*conform, _item("b", "numerics", "failed", found), _item("b", "memory", "passed")]}, 2.0)
    assert (v.outcome, v.cell, v.areas, v.cells_run) == (SILENT, "b", ("numerics",), 2)
    asked = "b does not conform (state_dict):\n  ranks [0]: asking Thunder raised at x.py:3 in f: KeyError: 'w'"
    assert classify({"cells": [_item("b", "state_dict", "failed", asked)]}, 1.0).outcome == RAISED
    raised = "cell b did not run to completion: Thunder raised at thunder/x.py:9 in f\nrank 0 failed"
    assert classify({"cells": [_item("b", "numerics", "failed", raised, ("failed", "aborted"))]}, 1).outcome == RAISED
    hung = "cell b did not run to completion\nrank 0 timeout"
    assert classify({"cells": [_item("b", "numerics", "failed", hung, ("timeout", "timeout"))]}, 1).outcome == TIMEOUT
    scenario = "b does not conform (numerics):\n  ranks [0, 1]: gradients over 2 micro-steps: Thunder raised TypeError"
    checkpoint = (
        "b does not conform (state_dict):\n  ranks [0]: full checkpoint: x.get_model_state_dict raised RuntimeError"
    )
    beside = "b does not conform (collectives):\n  ranks [0, 1]: backward reduce_scatters: expected 4, got 2"
    mixed = [_item("b", "numerics", "failed", scenario), _item("b", "collectives", "failed", beside)]
    assert classify({"cells": mixed}, 1).outcome == RAISED  # the raise is the cause, the rest its consequence
    assert classify({"cells": [_item("b", "state_dict", "failed", checkpoint)]}, 1).outcome == RAISED
    stale = "b conforms (collectives), but xfails entries cover it:\n  xfails.toml:113: stale: the item conforms now"
    v = classify({"cells": [_item("b", "collectives", "failed", stale)]}, 1)
    assert v.outcome == SILENT and v.findings == ("xfails.toml:113: stale: the item conforms now",)
    stopped = "b does not conform (memory): the cell stopped on what Thunder returned\n  ranks [0]: step 0: shape (2,)"
    assert classify({"cells": [_item("b", "memory", "failed", stopped)]}, 1).outcome == SILENT
    broke = "the kit broke, not Thunder: b (memory): rank 0: a check raised at conformance/checks/memory.py:9"
    assert classify({"cells": [_item("b", "memory", "error", broke)]}, 1).outcome == KIT_ERROR
    refused = {"cells": [], "cells_not_collected": ["b"], "exit_status": 5}
    assert classify(refused, 1).outcome == RAISED
    assert classify({"cells": [], "exit_status": 2}, 1).outcome == RAISED


def test_scores_count_only_what_kept_thunder_running() -> None:
    verdicts = [Verdict(SILENT), Verdict(SILENT), Verdict(SURVIVED), Verdict(RAISED), Verdict(TIMEOUT)]
    verdicts += [Verdict(NOT_COVERED), Verdict(INCOMPETENT)]
    s = report.score(verdicts)
    assert s.run == 5
    assert s.silent == pytest.approx(2 / 3)
    assert s.plain == pytest.approx(4 / 5)


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


def test_an_equivalent_counts_apart_unless_a_check_killed_it(tmp_path: Path) -> None:
    every = list(sites.sites("thunder/distributed/utils.py", SOURCE))[:3]
    reviewed = {m.id: equivalents.Equivalent(m.id, "why") for m in every[:2]}
    judged = [
        (every[0], Verdict(SURVIVED), ""),
        (every[1], Verdict(SILENT, 1, "c", ("numerics",)), ""),
        (every[2], Verdict(SURVIVED), ""),
    ]
    data = report.build(judged, reviewed, CoverageMap("0", {}, {}, (), {}))
    assert [m["outcome"] for m in data["mutants"]] == ["equivalent", SILENT, SURVIVED]
    assert data["equivalence_refuted"] == [every[1].id]
    assert data["score"]["silent_score"] == 0.5
    assert "the kit refuted" in report.markdown(data)


def test_diff_lists_only_the_mutants_on_the_lines_a_commit_range_changed(tmp_path: Path, capsys) -> None:
    """A two-commit history of Thunder's utils.py whose second commit is the installed file:
    ``--diff A..B`` lists the mutants of the lines B changed, and nothing else."""
    import json
    import subprocess

    from conformance.mutants.__main__ import main

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
    mutants mostly make Thunder raise or delete a check that always holds."""
    from conformance.mutants.__main__ import main
    from conformance.mutants.operators import KEPT_RUNNING, NAMES

    assert set(NAMES) - set(KEPT_RUNNING) == {
        "core/AddNot",
        "core/ReplaceTrueWithFalse",
        "core/ReplaceFalseWithTrue",
        "kit/DeleteCallStatement",
    }
    path = "thunder/distributed/utils.py"
    cmap = CoverageMap("0", {path: file_lines(installed_thunder() / path)}, {}, (), {})
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "coverage-map.json").write_text(json.dumps(cmap.to_json()))
    args = ["--map", str(tmp_path / "map"), "--files", path, "--list", "--out", str(tmp_path / "m")]
    assert main([*args, "--operators", "kept-running"]) == 0
    listed = {line.split()[0].split(":")[2].split("#")[0] for line in capsys.readouterr().out.splitlines()}
    assert listed and listed <= set(KEPT_RUNNING)

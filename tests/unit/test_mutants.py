"""Mutation analysis (conformance/mutants/) without a world: operators, mutant ids and samples,
the equivalents file, the overlay, cell selection, verdicts read off reports, scores
(the session and the command line: test_mutants_session.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from cosmic_ray.mutating import mutate_code

from conformance.checks.materialization import reset_error
from conformance.matrix.cells import Cell
from conformance.mutants import equivalents, report, sites, trial
from conformance.mutants.kills import (
    INCOMPETENT,
    KIT_ERROR,
    NOT_COVERED,
    RAISED,
    SILENT,
    SURVIVED,
    TIMEOUT,
    Verdict,
    classify,
    raises,
)
from conformance.mutants.operators import FAMILIES, KIT, NAMES, PRESETS, family
from conformance.mutants.overlay import Overlay, installed_thunder
from conformance.reports.coverage_map import CellLines, CoverageMap, file_lines
from tests.support.fake_thunder import SOURCE, fake_thunder


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


def test_a_blind_spot_is_judged_counted_a_survivor_and_shown_with_its_input(tmp_path: Path) -> None:
    every = list(sites.sites("thunder/distributed/utils.py", SOURCE))
    file = tmp_path / "eq.toml"
    entry = '[[blind_spot]]\nmutant = "{}"\nwhy = "no model of the kit pads it"\ninput = "a 5-row bias at 2 ranks"\n'
    file.write_text(entry.format(every[0].id) + entry.format(every[1].id))
    spots = equivalents.blind_spots(file, every)
    assert set(spots) == {every[0].id, every[1].id} and equivalents.load(file, every) == {}
    judged = [(every[0], Verdict(SURVIVED), ""), (every[1], Verdict(SILENT, 1, "c", ("numerics",)), "")]
    data = report.build(judged, {}, CoverageMap("0", {}, {}, (), {}), spots)
    assert [m["outcome"] for m in data["mutants"]] == [SURVIVED, SILENT]
    assert data["score"]["silent_score"] == 0.5  # the blind spot counts against the kit
    assert data["mutants"][0]["blind_spot"]["input"] == "a 5-row bias at 2 ranks"
    assert data["blind_spots_closed"] == [every[1].id]
    text = report.markdown(data)
    assert "Shown by: a 5-row bias at 2 ranks" in text and "Blind spots a check now sees" in text
    file.write_text(f'[[blind_spot]]\nmutant = "{every[0].id}"\nwhy = "x"\n')
    with pytest.raises(equivalents.EquivalentsError, match="names no 'input'"):
        equivalents.blind_spots(file, every)


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


def test_an_overlay_left_mutated_is_restored_when_an_analysis_opens_it(tmp_path: Path) -> None:
    """An analysis killed inside a trial never ran the trial's restore: the next one to open
    the overlay mends it first, else every later trial would carry that mutant too."""
    installed = installed_thunder()
    path = "thunder/distributed/utils.py"
    Overlay(tmp_path / "overlay", installed)
    left = tmp_path / "overlay" / path
    left.write_text("LEFT = 'by a killed trial'\n")
    compiled = Path(importlib.util.cache_from_source(str(left)))
    compiled.parent.mkdir(exist_ok=True)
    compiled.write_bytes(b"stale")
    again = Overlay(tmp_path / "overlay", installed)
    assert again.restored == [path]
    assert left.read_bytes() == (installed / path).read_bytes() and not compiled.exists()
    assert Overlay(tmp_path / "overlay", installed).restored == []


def test_a_suite_stopped_from_outside_is_sent_sigterm_first(tmp_path: Path) -> None:
    """Interrupted (Ctrl-C, or the analysis's SIGTERM made one), the trial's suite gets SIGTERM
    and time to stop its worlds, not an outright kill."""
    said = tmp_path / "said"
    child = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(said)!r}, 'w').write('stopping'), sys.exit(0)))\n"
        f"open({str(said)!r}, 'w').write('ready')\n"
        "time.sleep(60)\n"
    )

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    def once_ready() -> None:  # the interrupt comes once the child listens for SIGTERM
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (said.exists() and said.read_text() == "ready"):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with (tmp_path / "out.txt").open("w") as out:
            threading.Thread(target=once_ready, daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                trial.run_suite([sys.executable, "-c", child], dict(os.environ), out, timeout=60, grace=20)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert said.read_text() == "stopping"


def test_a_mutant_that_breaks_the_import_is_incompetent_not_a_kill(tmp_path: Path) -> None:
    root = fake_thunder(tmp_path)
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


def test_a_silent_kill_after_other_cells_must_recur_on_its_cell_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill that needs the cells run before it in the same process is the kit's state
    leaking across cells (plain jit's plan once shared between a checkpointed cell and the
    plain one) or a flake: the kit's failure, named, never a kill."""
    killed = Verdict(SILENT, 12, "mlp-x", ("memory",), "backward peak along the plan", 30.0, ("80 B over",))
    alone: list[Verdict] = []
    monkeypatch.setattr(trial, "_judged", lambda cells, *rest: alone.pop(0) if cells == ["mlp-x"] else killed)
    plan = trial.Plan(CoverageMap("0", {}, {}, (), {}), tmp_path)

    alone.append(Verdict(SURVIVED, 1, seconds=8.0))
    verdict = trial._confirmed(killed, tmp_path, {}, plan, 0.0)
    assert verdict.outcome == KIT_ERROR and verdict.cell == "mlp-x"
    assert "after 11 other cells, but on that cell alone survived" in verdict.detail

    alone.append(Verdict(SILENT, 1, "mlp-x", ("memory",), "backward peak along the plan", 9.0))
    assert trial._confirmed(killed, tmp_path, {}, plan, 0.0) == dataclasses.replace(killed, seconds=9.0)

    alone.append(Verdict(RAISED, 1, "mlp-x", (), "Thunder raised at ...", 7.0))
    assert trial._confirmed(killed, tmp_path, {}, plan, 0.0).outcome == RAISED


def test_a_mutant_in_a_statement_run_at_import_runs_where_it_can_matter(tmp_path: Path) -> None:
    """A statement of several lines run at import counts on any of its lines (what ``--diff``
    found on FSDPTransform's signature, once "not covered"): on every cell, but a function's
    header (a parameter's kind, a default) only where the function is called."""
    path = "thunder/distributed/utils.py"
    source = (
        "LIMITS = [\n    1,\n]\n\n\n"
        "def pad(\n    rows,\n    world=2,\n):\n    return rows + world\n\n\n"
        "def unused(n=3):\n    return n\n"
    )
    (tmp_path / "utils.py").write_text(source)
    lines = file_lines(tmp_path / "utils.py")
    assert {1, 6} <= set(lines.import_time) and lines.statement_of(8) == 6
    cells = {"slow": CellLines({path: (10,)}, 9.0, 2, False), "quick": CellLines({}, 1.0, 2, False)}
    cmap = CoverageMap("0", {path: lines}, cells, (), {})
    numbers = list(sites.sites(path, source, ["core/NumberReplacer"]))
    listed = next(m for m in numbers if m.line == 2)
    default = next(m for m in numbers if m.line == 8)
    never = next(m for m in numbers if m.line == 13)
    assert trial.cells_for(listed, cmap) == ["quick", "slow"]  # every cell, cheapest first
    assert trial.cells_for(default, cmap) == ["slow"]  # the cells that called pad
    assert trial.cells_for(never, cmap) == []  # no cell calls it: not covered
    assert CoverageMap.from_json(json.loads(json.dumps(cmap.to_json()))).files[path] == lines


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
    broke = "the kit broke, not Thunder: b (memory): rank 0: a check raised at conformance/checks/memory/__init__.py:9"
    assert classify({"cells": [_item("b", "memory", "error", broke)]}, 1).outcome == KIT_ERROR
    refused = {"cells": [], "cells_not_collected": ["b"], "exit_status": 5}
    assert classify(refused, 1).outcome == RAISED
    assert classify({"cells": [], "exit_status": 2}, 1).outcome == RAISED


def test_a_negative_cell_that_raises_the_wrong_error_is_a_raise_not_silently_wrong() -> None:
    """A model lacking reset_parameters must make Thunder raise a TypeError naming it: a
    mutant that crashes there on its own (a swapped hasattr) made Thunder raise, and only one
    that lets setup succeed kept Thunder running."""
    cell = Cell("no_reset", "meta_module_init", "fsdp_jit")
    crashed = reset_error(cell, TypeError("attribute name must be string, not 'Parameter'")).failures
    ran_on = reset_error(cell, None).failures
    assert crashed and raises([f"ranks [0, 1]: {f}" for f in crashed])
    assert ran_on and not raises([f"ranks [0, 1]: {f}" for f in ran_on])
    assert reset_error(cell, TypeError("Materialization requires that the `Scale.reset_parameters` ...")).failures == []


def test_scores_count_only_what_kept_thunder_running() -> None:
    verdicts = [Verdict(SILENT), Verdict(SILENT), Verdict(SURVIVED), Verdict(RAISED), Verdict(TIMEOUT)]
    verdicts += [Verdict(NOT_COVERED), Verdict(INCOMPETENT)]
    s = report.score(verdicts)
    assert s.run == 5
    assert s.silent == pytest.approx(2 / 3)
    assert s.plain == pytest.approx(4 / 5)


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


def test_every_operator_has_a_family_and_the_report_scores_each() -> None:
    assert {family(n) for n in NAMES} == set(FAMILIES)
    assert PRESETS["all"] == NAMES and set(PRESETS["kept-running"]) < set(NAMES)
    every = list(sites.sites("thunder/distributed/utils.py", SOURCE))
    judged = [(m, Verdict(SILENT if i % 2 else SURVIVED, 1, "c", ("numerics",)), "") for i, m in enumerate(every)]
    data = report.build(judged, {}, CoverageMap("0", {}, {}, (), {}))
    assert sum(f["run"] for f in data["families"].values()) == len(every)
    assert set(data["families"]) == {family(m.operator) for m in every}
    assert "## By kind of change" in report.markdown(data)

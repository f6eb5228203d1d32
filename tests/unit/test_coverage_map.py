"""The coverage map (conformance/reports/coverage_map.py) on hand-made sources and data: what
a cell can run, statements of several lines, the cells a line selects, and nothing of
coverage.py imported while ``--thunder-coverage`` is off."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conformance.frontend import affected
from conformance.reports.coverage_map import CellLines, CoverageMap, file_lines, ranges, thunder_relative
from tests.support.suite_runs import ROOT

SOURCE = textwrap.dedent(
    '''\
    import math

    LIMIT = 3


    def shard(rows, world):
        """A docstring is no statement."""
        chunk = math.ceil(
            rows / world
        )
        return chunk


    class Plan:
        size = 4

        @staticmethod
        def pad(rows):
            return rows + 1
    '''
)


def test_only_function_bodies_are_runnable_and_continuations_map_to_their_statement(tmp_path: Path) -> None:
    path = tmp_path / "thunder" / "distributed" / "utils.py"
    path.parent.mkdir(parents=True)
    path.write_text(SOURCE)
    lines = file_lines(path)
    assert lines.runnable == (8, 11, 19)
    assert set(lines.import_time) == {1, 3, 6, 14, 15, 17, 18}  # the decorator and the def line
    assert lines.statement_of(9) == 8 and lines.statement_of(10) == 8 and lines.statement_of(11) == 11
    assert thunder_relative(str(path)) == "thunder/distributed/utils.py"


def make_map(tmp_path: Path) -> CoverageMap:
    path = tmp_path / "thunder" / "distributed" / "utils.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SOURCE)
    rel = "thunder/distributed/utils.py"
    cells = {
        "slow": CellLines({rel: (8, 11)}, seconds=9.0, world_size=2, simulated=False),
        "cheap": CellLines({rel: (8,)}, seconds=1.0, world_size=3, simulated=False),
        "other": CellLines({}, seconds=0.5, world_size=2, simulated=False),
    }
    return CoverageMap("0.0", {rel: file_lines(path)}, cells, ("died",), {rel: (19,)})


def test_a_line_selects_the_cells_that_ran_its_statement_cheapest_first(tmp_path: Path) -> None:
    cmap = make_map(tmp_path)
    rel = "thunder/distributed/utils.py"
    assert cmap.cells_running(rel, [9]) == ["cheap", "slow"]  # line 9 continues line 8's statement
    assert cmap.cells_running(rel, [11]) == ["slow"]
    assert cmap.cells_running(rel, [3]) == []  # import time: no cell is seen to run it
    assert cmap.cells_running(rel, [19]) == ["other", "cheap", "slow"]  # the probe's line: every cell
    assert cmap.not_run(rel) == []
    assert CoverageMap.from_json(cmap.to_json()) == cmap


def test_a_sole_carrier_is_a_cell_that_alone_ran_some_line(tmp_path: Path) -> None:
    cmap = make_map(tmp_path)
    assert cmap.sole_carriers() == {"slow"}  # line 11; line 8 is cheap's too
    rel = "thunder/distributed/utils.py"
    # a line the probe runs is every cell's: no cell carries it alone
    probed = dataclasses.replace(cmap, probe={rel: (11, 19)})
    assert probed.sole_carriers() == set()


def test_ranges_are_spans() -> None:
    assert ranges([9, 3, 4, 5, 12, 13]) == "3-5, 9, 12-13"
    assert ranges([]) == ""


def test_with_the_option_off_nothing_of_coverage_is_imported() -> None:
    code = (
        "import sys\n"
        "import conformance.frontend.plugin, conformance.frontend.runner, conformance.reports.writer\n"
        "import conformance.reports.summary\n"
        "assert 'coverage' not in sys.modules, 'coverage imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_a_change_reaches_the_cells_that_ran_its_old_lines_and_those_the_map_cannot_speak_for(
    tmp_path: Path,
) -> None:
    cmap = make_map(tmp_path)
    diff = (
        "--- a/thunder/distributed/utils.py\n+++ b/thunder/distributed/utils.py\n"
        "@@ -11 +11 @@\n-        return chunk\n+        return chunk + 1\n"
    )
    (tmp_path / "change.diff").write_text(diff)
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "coverage-map.json").write_text(json.dumps(cmap.to_json()))
    change = affected.load(str(tmp_path / "change.diff"), tmp_path / "map")
    assert change.changed == {"thunder/distributed/utils.py": {11}}
    assert [c for c in ("slow", "cheap", "other", "died", "new") if change.reaches(c)] == ["slow", "died", "new"]
    assert change.note(3, 2)["cells_left_out"] == 2
    elsewhere = affected.load("thunder/core/module.py:10", tmp_path / "map")  # not traced: every cell
    assert elsewhere.untraced == ["thunder/core/module.py"] and elsewhere.reaches("other")
    with pytest.raises(pytest.UsageError, match="needs --coverage-map"):
        affected.load("thunder/distributed/utils.py:11", None)
    with pytest.raises(pytest.UsageError, match="is not a line or a range"):
        affected.load("thunder/distributed/utils.py:x", tmp_path / "map")

"""``--thunder-coverage``: the lines of Thunder each cell ran, named by the cell, on a run of an
FSDP cell and a DDP cell (what each transform's own methods are must show up in one only);
then ``python -m conformance.mutants`` on that map."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.matrix.cells import Cell
from conformance.matrix.profiles import cells
from conformance.reports.coverage_map import CoverageMap
from tests.planted import cells as planted
from tests.support.suite_runs import (
    ROOT,
    SuiteRun,
    pins_entries_naming,
    probed_on_this_machine,
    run_suite,
    runs_to_the_end,
)

pytestmark = pytest.mark.slow


@dataclasses.dataclass(frozen=True)
class Traced:
    """The traced run of one FSDP and one DDP cell of ci's."""

    run: SuiteRun
    fsdp: str
    ddp: str


def _mlp_cell(transform: Callable[[Cell], bool]) -> str:
    """ci's first mlp cell at world size 2 of ``transform`` that trains to the end and whose
    numerics conform on the pin (where the mutant below must show): the array changes, the
    kinds of cell stay."""
    probed = probed_on_this_machine()
    for cell in cells("ci", 2, probed):
        kind = cell.model == "mlp" and not cell.simulated and cell.world_size == 2 and transform(cell)
        if kind and runs_to_the_end(cell, probed) and not pins_entries_naming(cell, "numerics"):
            return cell.id
    raise AssertionError("ci holds no such mlp cell")


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    fsdp, ddp = _mlp_cell(planted.FSDP), _mlp_cell(planted.DDP)
    run = run_suite(tmp_path_factory.mktemp("traced"), "--thunder-coverage", "-k", f"{fsdp} or {ddp}")
    return Traced(run, fsdp, ddp)


def first_body_line(rel: str, cls: str, method: str) -> int:
    """The first statement of ``cls.method`` in the installed Thunder, read from its source (a
    docstring is no statement coverage.py sees run)."""
    spec = importlib.util.find_spec("thunder")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent.parent / rel
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    body = item.body[1:] if ast.get_docstring(item) is not None else item.body
                    return body[0].lineno
    raise AssertionError(f"{cls}.{method} is not in {rel}")


def test_each_cell_names_the_lines_of_its_own_transform(traced: Traced) -> None:
    run, FSDP, DDP = traced.run, traced.fsdp, traced.ddp
    assert run.returncode == 0, run.output
    cmap = CoverageMap.load(run.report_dir)
    assert set(cmap.cells) == {FSDP, DDP}
    assert cmap.unknown == ()
    fsdp_v2, ddp_v2 = "thunder/distributed/transforms/fsdp_v2.py", "thunder/distributed/transforms/ddp_v2.py"
    sharding = first_body_line(fsdp_v2, "FSDPTransform", "transform_module")
    replicating = first_body_line(ddp_v2, "DDPTransform", "transform_module")
    assert sharding in cmap.cells[FSDP].lines[fsdp_v2]
    assert replicating in cmap.cells[DDP].lines[ddp_v2]
    assert ddp_v2 not in cmap.cells[FSDP].lines
    assert sharding not in cmap.cells[DDP].lines.get(fsdp_v2, ())
    assert cmap.cells_running(fsdp_v2, [sharding]) == [FSDP]
    assert cmap.cells_running(ddp_v2, [replicating]) == [DDP]
    # every run probes first: a line only the probe ran counts as run by every cell
    assert cmap.probe
    probe_file, probe_lines = next(iter(cmap.probe.items()))
    assert set(cmap.cells_running(probe_file, probe_lines[:1])) == {FSDP, DDP}


def test_the_report_names_unrun_lines_and_links_coverages_html(traced: Traced) -> None:
    run = traced.run
    summary = run.report["thunder_coverage"]
    assert summary["cells"] == 2
    files = summary["files"]
    # the legacy FSDP transform (transforms/fsdp.py) is not what either composition runs
    legacy = files["thunder/distributed/transforms/fsdp.py"]
    assert legacy["ran"] == 0 and legacy["runnable"] > 100
    assert 0 < files["thunder/distributed/transforms/fsdp_v2.py"]["ran"] < files[
        "thunder/distributed/transforms/fsdp_v2.py"
    ]["runnable"]
    assert "Thunder lines run" in run.summary
    html = run.report_dir / summary["html"]
    pages = "".join(p.read_text() for p in html.parent.glob("*fsdp_v2_py.html"))
    assert traced.fsdp in pages  # coverage's own page lists the contexts (the cells) of each line
    assert not any((run.report_dir / "thunder-coverage-data").glob("*")), "the ranks' data files are combined away"


def test_a_mutant_runs_on_the_cells_of_its_line_and_a_check_finds_it(traced: Traced, tmp_path: Path) -> None:
    """Gradients multiplied by the world size instead of divided before their reduction
    (FSDP's and DDP's backward rule): Thunder runs on, numerics finds it on the cheaper cell."""
    installed = Path(importlib.util.find_spec("thunder").origin).parent  # type: ignore[union-attr]
    before = (installed / "distributed" / "prims.py").read_bytes()
    args = [
        "--map",
        str(traced.run.report_dir),
        "--out",
        str(tmp_path / "mutants"),
        "--files",
        "thunder/distributed/prims.py",
        "--function",
        "synchronize_backward_rule",
        "--operators",
        "core/ReplaceBinaryOperator_Div_Mul",
    ]
    command = [sys.executable, "-m", "conformance.mutants", *args, "--", "--cell-timeout", "120"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "mutants" / "mutants.json").read_text())
    [mutant] = data["mutants"]
    assert "grad * group.size()" in mutant["diff"]
    assert mutant["outcome"] == "killed: silently wrong", mutant
    assert "numerics" in mutant["areas"] and mutant["cell"] in (traced.fsdp, traced.ddp) and mutant["cells_run"] == 1
    assert data["score"]["silent_score"] == 1.0
    assert (installed / "distributed" / "prims.py").read_bytes() == before
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "0 mutants added, 0 to judge" in again.stdout, again.stdout + again.stderr

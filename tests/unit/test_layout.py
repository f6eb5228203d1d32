"""The kit's architecture, read from its imports (``ast``, no import is executed): which role
each folder plays, which roles it may import, and no import cycle anywhere.

Every import counts, including those inside functions (the lazy imports that keep Thunder
out of the pytest process are dependencies too) and those under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from conformance.checks.registry import AREAS
from tests.support.suite_runs import ROOT

PACKAGES = ("conformance", "fixtures", "transforms")

# role -> the roles its modules may import (their own role included). A role is the first
# rule in ROLES whose prefix names the module.
ROLES = {
    "world": "conformance.world",  # the task-agnostic runner: imports nothing else of the kit
    "matrix": "conformance.matrix",
    "checks": "conformance.checks",
    "rank": "conformance.rank",
    "reports": "conformance.reports",
    "frontend": "conformance.frontend",
    "suite": "conformance.test_",  # the test modules of the suite
    "commands": "conformance.compare",  # `python -m` entry points over the reports
    "dashboard": "conformance.dashboard",  # `python -m conformance.dashboard`: the reports' site
    # `python -m conformance.bisect`: talks to the suite as a user does (pytest's command line,
    # report.json), so it imports nothing else of the kit
    "bisect": "conformance.bisect",
    # `python -m conformance.mutants`: runs the suite as a user does (pytest's command line,
    # report.json) on an overlay of Thunder; reads the coverage map through the reports, and
    # resolves the trials' backend as the world's launch does (where their ranks hold tensors)
    "mutants": "conformance.mutants",
    # `python -m conformance.join`: a machine's join agent, which is the world's runner only
    "join": "conformance.join",
    "package": "conformance",
    "fixtures": "fixtures",
    "transforms": "transforms",
}
ALLOWED = {
    "world": {"world"},
    "transforms": {"transforms"},
    "fixtures": {"fixtures", "transforms"},
    "matrix": {"matrix", "fixtures"},
    # checks read a record; they never reach into the rank side that fills it, nor the front end
    "checks": {"checks", "matrix", "fixtures", "transforms"},
    # and speaks the world's protocol: another node's rank writes its phase into the control store
    "rank": {"rank", "checks", "matrix", "fixtures", "transforms", "world"},
    "reports": {"reports", "checks", "matrix"},
    # the pytest process: it names the rank side's entry point in a task, never imports it
    "frontend": {"frontend", "world", "checks", "matrix", "reports", "fixtures"},
    "suite": {"matrix", "fixtures"},
    "commands": {"reports"},
    "dashboard": {"reports"},
    "bisect": {"bisect"},
    "mutants": {"mutants", "reports", "world"},
    "join": {"world"},
    "package": set(),
}


def role(module: str) -> str:
    for name, prefix in ROLES.items():
        if module == prefix or module.startswith(prefix if prefix.endswith("_") else prefix + "."):
            return name
    raise AssertionError(f"{module} belongs to no role: give it one in tests/unit/test_layout.py")


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the kit's modules it imports (a ``from package import name`` counts as the
    submodule where ``name`` is one, else as the package)."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        # the package a relative import starts from (a package's __init__ is its own)
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.add(sub if sub in known else source)
        graph[module] = {t for t in targets if t in known and t != module}
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} ({role(module)}) imports {target} ({role(target)})"
        for module, targets in graph.items()
        for target in targets
        if role(target) not in ALLOWED[role(module)]
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_import_follows_the_dependency_rule() -> None:
    assert violations(import_graph(ROOT)) == []


def test_no_import_cycle() -> None:
    assert cycles(import_graph(ROOT)) == []


@pytest.fixture
def copy_of_the_kit(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package)
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n\ndef _planted() -> None:\n    {line}\n")


@pytest.mark.parametrize(
    ("module", "line", "says"),
    [
        ("conformance/checks/numerics/steps.py", "from conformance.rank import train", "steps (checks) imports"),
        ("conformance/world/launch.py", "from conformance.matrix.cells import Cell", "launch (world) imports"),
        ("conformance/frontend/verdict.py", "import conformance.rank.entry", "verdict (frontend) imports"),
        ("conformance/reports/summary.py", "from conformance.frontend import runner", "summary (reports) imports"),
        ("conformance/checks/memory/__init__.py", "from ...rank import measure", "memory (checks) imports"),
    ],
    ids=[
        "check-imports-rank",
        "world-imports-matrix",
        "frontend-imports-rank",
        "reports-import-frontend",
        "relative-import-of-rank",
    ],
)
def test_a_planted_back_import_is_caught(copy_of_the_kit: Path, module: str, line: str, says: str) -> None:
    _append(copy_of_the_kit / module, line)
    found = violations(import_graph(copy_of_the_kit))
    assert len(found) == 1 and says in found[0], found


def test_a_planted_cycle_is_caught(copy_of_the_kit: Path) -> None:
    # the registry imports every area, and each area its interface: the interface importing
    # the registry closes a circle
    _append(copy_of_the_kit / "conformance/checks/area.py", "from conformance.checks import registry")
    assert violations(import_graph(copy_of_the_kit)) == []
    [cycle] = cycles(import_graph(copy_of_the_kit))
    assert {"conformance.checks.area", "conformance.checks.registry"} <= set(cycle)


def test_each_check_area_has_one_test_module() -> None:
    """Adding an area is its module, its registry line and conformance/test_<area>.py."""
    suite = {p.stem.removeprefix("test_") for p in (ROOT / "conformance").glob("test_*.py")} - {"generated"}
    assert suite == set(AREAS)
    for name in AREAS:
        tree = ast.parse((ROOT / "conformance" / f"test_{name}.py").read_text())
        declared = [
            n.value.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "AREA"
        ]
        assert declared == [name]


def _imported_inside_functions(folders: tuple[str, ...]) -> set[str]:
    """Absolute imports that sit below a module's top level in ``folders``."""
    found = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            top = {id(node) for node in tree.body}
            for node in ast.walk(tree):
                if id(node) in top:
                    continue
                if isinstance(node, ast.Import):
                    found |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module)
    return found


def test_the_zygote_preloads_what_ranks_import_inside_functions() -> None:
    """A forked rank must not import Thunder or litgpt again on its first cell (seconds per
    rank of every world): what the rank side imports lazily is in the zygote's preload, or
    imported by it (coverage.py where --thunder-coverage asks for its tracer)."""
    import json
    import subprocess
    import sys

    lazy = _imported_inside_functions(("conformance/rank", "conformance/checks", "fixtures", "transforms"))
    program = (
        "import importlib, json, sys\n"
        "from conformance.frontend.runner import new_zygote\n"
        "for name in new_zygote(traced=True).preload: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {sorted(lazy)!r} if m not in sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    missing = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not missing, f"imported by every forked rank again: {missing} (runner.RANK_IMPORTS)"

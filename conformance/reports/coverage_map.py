"""The coverage map: which lines of the Thunder under test each cell ran (``--thunder-coverage``).

Every rank saves its own coverage.py data, one dynamic context per cell
(conformance/rank/thunder_coverage.py); at the end of the run the controller combines them
into ``thunder-coverage.sqlite``, writes coverage's own HTML beside report.html (contexts
shown per line) and ``coverage-map.json``, which mutation analysis
(``python -m conformance.mutants``) and change-based cell selection read.

Lines are counted as coverage.py counts statements (a statement of several lines is its
first line), and only where a cell can run them: inside a function body. A module's top
level, its class bodies, ``def`` lines and decorators run when Thunder is imported, before
any rank's tracer starts, so no cell is ever seen to run them; the map names them
``import_time`` instead of calling them unrun.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# What the ranks trace, relative to the Thunder package's folder: its distributed stack and
# the materialization transform (the rest of Thunder is traced by Thunder's own tests).
SCOPE = ("distributed/**/*.py", "transforms/materialization.py")
DATA_NAME = "thunder-coverage.sqlite"  # the combined data; each process writes DATA_NAME.<suffix>
MAP_NAME = "coverage-map.json"
HTML_DIR = "thunder-coverage"
PROBE = "probe"  # the context of the composition probe, which every run runs first


@dataclasses.dataclass(frozen=True)
class FileLines:
    """One traced Thunder file: its hash (a map is only good for the source it was made of),
    the statements a cell can run, those run at import, and each continuation line's first."""

    sha256: str
    runnable: tuple[int, ...]
    import_time: tuple[int, ...]
    first_line: dict[int, int]  # a line inside a statement of several lines -> its first line
    # a line of a top-level function's or method's header (``def`` to the body) -> its body's
    # span: a change there runs at import but only matters once the function is called
    headers: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def statement_of(self, line: int) -> int:
        return self.first_line.get(line, line)

    def body_called(self, lines: Iterable[int]) -> list[int] | None:
        """The runnable lines of the body whose header holds every one of ``lines`` (None if
        some are outside one header): a cell that ran any of them called the function."""
        spans = {self.headers.get(line) for line in lines}
        if not spans or None in spans:
            return None
        return [n for n in self.runnable if any(a <= n <= b for a, b in spans)]


@dataclasses.dataclass(frozen=True)
class CellLines:
    """What one cell ran: lines per file (Thunder-relative path, ``thunder/...``), and what it
    cost the run (its items' seconds), which orders cells cheapest first."""

    lines: dict[str, tuple[int, ...]]
    seconds: float
    world_size: int
    simulated: bool


@dataclasses.dataclass(frozen=True)
class CoverageMap:
    thunder_version: str
    files: dict[str, FileLines]
    cells: dict[str, CellLines]
    unknown: tuple[str, ...]  # cells that ran but left no lines (a rank died or timed out in them)
    probe: dict[str, tuple[int, ...]]

    def not_run(self, path: str) -> list[int]:
        """The runnable lines of ``path`` that neither a cell nor the probe ran."""
        ran = set(self.probe.get(path, ()))
        for cell in self.cells.values():
            ran.update(cell.lines.get(path, ()))
        return [line for line in self.files[path].runnable if line not in ran]

    def cells_running(self, path: str, lines: Iterable[int]) -> list[str]:
        """The cells that ran any of ``lines`` of ``path`` (a line inside a statement of
        several counts as its statement), cheapest first; the probe's lines count as run by
        every cell, as every run probes first."""
        known = self.files.get(path)
        wanted = {known.statement_of(line) for line in lines} if known else set(lines)
        if wanted & set(self.probe.get(path, ())):
            chosen = list(self.cells)
        else:
            chosen = [c for c, cl in self.cells.items() if wanted & set(cl.lines.get(path, ()))]
        return sorted(chosen, key=lambda c: (self.cells[c].seconds, c))

    def sole_carriers(self) -> frozenset[str]:
        """The cells that alone ran some line: a change there reaches no other cell (the probe's
        lines count as every cell's, as in ``cells_running``)."""
        probed = {path: set(lines) for path, lines in self.probe.items()}
        runners: dict[tuple[str, int], list[str]] = {}
        for cell, lines in self.cells.items():
            for path, ran in lines.lines.items():
                for line in ran:
                    if line not in probed.get(path, ()):
                        runners.setdefault((path, line), []).append(cell)
        return frozenset(cells[0] for cells in runners.values() if len(cells) == 1)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CoverageMap:
        files = {
            p: FileLines(
                f["sha256"],
                tuple(f["runnable"]),
                tuple(f["import_time"]),
                {int(k): v for k, v in f["first_line"].items()},
                {int(k): (a, b) for k, (a, b) in f.get("headers", {}).items()},  # maps made before it: none
            )
            for p, f in data["files"].items()
        }
        cells = {
            c: CellLines({p: tuple(ls) for p, ls in v["lines"].items()}, v["seconds"], v["world_size"], v["simulated"])
            for c, v in data["cells"].items()
        }
        probe = {p: tuple(ls) for p, ls in data["probe"].items()}
        return cls(data["thunder_version"], files, cells, tuple(data["unknown"]), probe)

    @classmethod
    def load(cls, path: Path) -> CoverageMap:
        """From a report folder or its ``coverage-map.json``."""
        if path.is_dir():
            path = path / MAP_NAME
        return cls.from_json(json.loads(path.read_text()))


def thunder_relative(path: str) -> str:
    """``.../site-packages/thunder/distributed/utils.py`` -> ``thunder/distributed/utils.py``:
    the path a diff of Thunder's repository names, wherever it was installed."""
    parts = Path(path).parts
    top = len(parts) - 1 - parts[::-1].index("thunder")
    return "/".join(parts[top:])


def _function_body_spans(tree: ast.AST) -> list[tuple[int, int]]:
    return [
        (node.body[0].lineno, node.end_lineno or node.body[-1].lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and isinstance(node.body, list)
    ]


def _headers(tree: ast.Module) -> dict[int, tuple[int, int]]:
    """Each line of a def's header, for the functions a module or class defines at import."""
    out: dict[int, tuple[int, int]] = {}
    scopes: list[ast.Module | ast.ClassDef] = [tree, *(n for n in tree.body if isinstance(n, ast.ClassDef))]
    for scope in scopes:
        for node in scope.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                span = (node.body[0].lineno, node.end_lineno or node.body[-1].lineno)
                out.update({line: span for line in range(node.lineno, node.body[0].lineno)})
    return out


def source_digest(text: str) -> str:
    """The sha256 of a source file's text: which source a map (or a mutant) was made of."""
    return hashlib.sha256(text.encode()).hexdigest()


def file_lines(path: Path) -> FileLines:
    from coverage.parser import PythonParser

    text = path.read_text()
    parser = PythonParser(text=text, filename=str(path))
    parser.parse_source()
    tree = ast.parse(text)
    spans = _function_body_spans(tree)
    runnable = sorted(s for s in parser.statements if any(a <= s <= b for a, b in spans))
    import_time = sorted(set(parser.statements) - set(runnable))
    first = {n: parser.first_line(n) for n in range(1, text.count("\n") + 2)}
    return FileLines(
        source_digest(text),
        tuple(runnable),
        tuple(import_time),
        {n: f for n, f in first.items() if f != n},
        _headers(tree),
    )


def combine(data_dir: Path, report_dir: Path) -> Any:
    """The ranks' data files combined into ``report_dir/DATA_NAME`` (a coverage.Coverage)."""
    import coverage

    tracer = coverage.Coverage(data_file=str(report_dir / DATA_NAME), config_file=False)
    tracer.erase()  # an earlier run's combined data
    if any(data_dir.glob(DATA_NAME + ".*")):  # none where no rank saved (every cell unsupported)
        tracer.combine([str(data_dir)], keep=False)
    tracer.save()
    return tracer


def build(tracer: Any, thunder_root: Path, thunder_version: str, records: list[dict[str, Any]]) -> CoverageMap:
    """The map from the combined data and the run's item records (each cell's cost)."""
    data = tracer.get_data()
    files: dict[str, FileLines] = {}
    for pattern in SCOPE:
        for path in sorted(thunder_root.glob(pattern)):
            files[thunder_relative(str(path))] = file_lines(path)
    per_cell: dict[str, dict[str, set[int]]] = {}
    for measured in data.measured_files():
        rel = thunder_relative(measured)
        if rel not in files:
            continue
        for line, contexts in data.contexts_by_lineno(measured).items():
            first = files[rel].statement_of(line)
            for context in contexts:
                per_cell.setdefault(context, {}).setdefault(rel, set()).add(first)
    cost: dict[str, float] = {}
    axes: dict[str, dict[str, Any]] = {}
    for rec in records:
        if "cell" in rec and rec.get("outcome") != "unsupported":
            cost[rec["cell"]] = cost.get(rec["cell"], 0.0) + rec.get("duration", 0.0)
            axes[rec["cell"]] = rec.get("axes", {})
    cells = {
        cell: CellLines(
            {p: tuple(sorted(ls)) for p, ls in sorted(per_cell[cell].items())},
            round(seconds, 3),
            int(axes[cell].get("world_size", 0)),
            bool(axes[cell].get("simulated", False)),
        )
        for cell, seconds in cost.items()
        if cell in per_cell
    }
    unknown = tuple(sorted(c for c in cost if c not in per_cell))
    probe = {p: tuple(sorted(ls)) for p, ls in sorted(per_cell.get(PROBE, {}).items())}
    return CoverageMap(thunder_version, files, cells, unknown, probe)


def ranges(lines: Iterable[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    spans: list[list[int]] = []
    for line in sorted(lines):
        if spans and line == spans[-1][1] + 1:
            spans[-1][1] = line
        else:
            spans.append([line, line])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def per_file(cmap: CoverageMap) -> dict[str, dict[str, Any]]:
    """report.json's ``thunder_coverage.files``: per Thunder file, its runnable lines, how
    many some cell ran and which none did."""
    out = {}
    for path, lines in cmap.files.items():
        not_run = cmap.not_run(path)
        out[path] = {
            "runnable": len(lines.runnable),
            "ran": len(lines.runnable) - len(not_run),
            "not_run": ranges(not_run),
        }
    return out


def write(
    data_dir: Path, report_dir: Path, thunder_root: Path, thunder_version: str, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """Combine, write the map and coverage's HTML; report.json's ``thunder_coverage``."""
    tracer = combine(data_dir, report_dir)
    cmap = build(tracer, thunder_root, thunder_version, records)
    (report_dir / MAP_NAME).write_text(json.dumps(cmap.to_json()))
    html = None
    if tracer.get_data().measured_files():
        tracer.html_report(
            directory=str(report_dir / HTML_DIR),
            show_contexts=True,
            title=f"Thunder {thunder_version}: the lines each cell ran",
        )
        html = f"{HTML_DIR}/index.html"
    return {
        "map": MAP_NAME,
        "html": html,
        "cells": len(cmap.cells),
        "unknown": list(cmap.unknown),
        "files": per_file(cmap),
    }


def section(thunder_coverage: dict[str, Any] | None, shown: int = 12) -> list[str]:
    """summary.md's lines of Thunder that no cell ran (``--thunder-coverage`` runs only)."""
    if thunder_coverage is None:
        return []
    files = thunder_coverage["files"]
    lines = [
        f"Thunder lines run (`--thunder-coverage`; {thunder_coverage['cells']} cells mapped, "
        f"map: `{thunder_coverage['map']}`, per line: `{thunder_coverage['html']}`):",
        "",
        "| file | lines run | not run by any cell |",
        "|---|---|---|",
    ]
    for path, f in sorted(files.items()):
        not_run = f["not_run"].split(", ") if f["not_run"] else []
        more = f", … {len(not_run) - shown} more spans" if len(not_run) > shown else ""
        lines.append(f"| `{path}` | {f['ran']} of {f['runnable']} | {', '.join(not_run[:shown])}{more} |")
    if thunder_coverage["unknown"]:
        lines.append("")
        lines.append(
            "Lines unknown (a rank died or timed out): " + ", ".join(f"`{c}`" for c in thunder_coverage["unknown"])
        )
    return [*lines, ""]

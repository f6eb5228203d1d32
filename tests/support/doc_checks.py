"""The docs checkers (tests/unit/test_docs.py runs them on the repository, and on planted
input to show each one fails): README.md's size, internal links (files and GitHub-style heading
anchors), backticked repository paths and dotted kit names, cited planted bugs, and
docs/findings.md against xfails.toml.

Names are resolved without importing the kit (so without Thunder): a dotted name's module
prefix by file, the rest by an ``ast`` scan of that module.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_LIMIT = 15_000
# where a backticked repository path may start (a bare file name is checked when it is one
# of the top-level files below)
TOP_DIRS = ("conformance", "fixtures", "transforms", "tests", "tools", "docs", ".github", "examples")
TOP_FILES = ("README.md", "xfails.toml", "tox.ini", "pyproject.toml", "conftest.py")
PACKAGES = ("conformance", "fixtures", "transforms", "tests")

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE = re.compile(r"(`+)(.+?)\1")
_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")
_DOTTED = re.compile(r"(?:" + "|".join(PACKAGES) + r")(?:\.\w+)+(?::\w+(?:\.\w+)*)?")


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of ``text`` outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lower case, punctuation but
    hyphens and underscores removed, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(text):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _outside_code(line: str) -> str:
    return _CODE.sub(lambda m: " " * len(m.group(0)), line)


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``doc`` whose file does not exist, or whose #anchor is no
    heading of its target: ``file:line: target (why)``."""
    text = doc.read_text()
    out = []
    for n, line in prose_lines(text):
        for target in _LINK.findall(_outside_code(line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(root)}:{n}: {target}"
            if not dest.exists():
                out.append(f"{where} (no such file)")
            elif anchor and (dest.is_dir() or dest.suffix != ".md"):
                out.append(f"{where} (an anchor into a file that is not Markdown)")
            elif anchor and anchor not in anchors(dest.read_text()):
                out.append(f"{where} (no heading with that anchor)")
    return out


def _names_of(node: ast.stmt) -> set[str]:
    """The names a top-level statement binds: a function or class, assignment targets,
    imports."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    return set()


def _defines(tree: ast.Module, names: list[str]) -> bool:
    """Whether the module ``tree`` defines ``names[0]`` at its top level and, where that is a
    class, ``names[1]`` in its body (and so on); past a name that is not a class (a value, an
    instance's attribute) nothing is followed further."""
    body: list[ast.stmt] = tree.body
    for name in names:
        found = [node for node in body if name in _names_of(node)]
        if not found:
            return False
        if not isinstance(found[-1], ast.ClassDef):
            return True
        body = found[-1].body
    return True


def resolves(dotted: str, root: Path = ROOT) -> bool:
    """Whether a kit name such as ``conformance.checks.memory.Terms`` or
    ``conformance.rank.probe:probe_compositions`` exists: the longest prefix that is a module
    or package by file, the rest defined there (or a submodule of a package)."""
    module, _, attr = dotted.partition(":")
    parts = module.split(".") + (attr.split(".") if attr else [])
    for cut in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:cut])
        rest = parts[cut:]
        if base.with_suffix(".py").is_file():
            source = base.with_suffix(".py")
        elif base.is_dir():
            source = base / "__init__.py"
            if not rest:
                return True
            if not source.is_file():
                return False
        else:
            continue
        return not rest or _defines(ast.parse(source.read_text()), rest)
    return False


def _exists(root: Path, path: str) -> bool:
    """Whether the repository path exists. A module named at package level (``a/b/``)
    exists as the package or as the single module ``a/b.py``, so that a doc's name survives a
    module being split into a package of the same name."""
    if (root / path).exists():
        return True
    return path.endswith("/") and (root / (path.rstrip("/") + ".py")).is_file()


def stale_names(doc: Path, root: Path = ROOT) -> list[str]:
    """Each backticked repository path or dotted kit name in ``doc`` that does not exist:
    ``file:line: name``. Spans with placeholders (``<area>``, ``*``, ``{}``) are patterns, not
    names, and are left alone; so are paths under ``thunder/``, which name files of the Thunder
    under test, not of this repository."""
    out = []
    for n, line in prose_lines(doc.read_text()):
        for _, span in _CODE.findall(line):
            span = span.strip()
            if any(c in span for c in "<>*{} "):
                continue
            where = f"{doc.relative_to(root)}:{n}: {span}"
            if span.startswith("thunder/"):
                continue
            if _PATH.fullmatch(span) and (
                span in TOP_FILES or ("/" in span and (span.split("/")[0] in TOP_DIRS or span.endswith(".py")))
            ):
                if not _exists(root, span):
                    out.append(where)
            elif _DOTTED.fullmatch(span.removesuffix("()")) and not resolves(span.removesuffix("()"), root):
                out.append(where)
    return out


def findings_doc():
    spec = importlib.util.spec_from_file_location("findings_doc", ROOT / "tools" / "findings_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def findings_stale(root: Path = ROOT) -> bool:
    """Whether docs/findings.md differs from what tools/findings_doc.py makes of xfails.toml."""
    page = root / "docs" / "findings.md"
    expected = findings_doc().render((root / "xfails.toml").read_text())
    return not page.is_file() or page.read_text() != expected


# a planted bug cited as shown caught: the first column of a check page's "planted bug" table,
# or the README's "smallest regression shown caught" column (`name`: what it does)
_CITED_BUG = re.compile(r"^\| `([a-z0-9_]+)` \||\| `([a-z0-9_]+)`: [^|]*\| \[")


def cited_bugs(doc: Path) -> set[str]:
    return {a or b for line in doc.read_text().splitlines() if (m := _CITED_BUG.search(line)) for a, b in [m.groups()]}

"""The docs checkers (tests/unit/test_docs.py runs them on the repository, and on planted
input to show each one fails): README.md's size, internal links (files and GitHub-style heading
anchors), backticked repository paths and dotted kit names, cited planted bugs, and
docs/findings.md against xfails.toml.

Names are resolved without importing the kit (so without Thunder): a dotted name's module
prefix by file, the rest by an ``ast`` scan of that module.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the two commands README.md starts with: everything a fresh machine needs, then the suite or the kit's tests
README_COMMANDS = [
    'python3 -m pip install "tox>=4.11" && python3 -m tox -e conformance',
    'python3 -m pip install "tox>=4.11" && python3 -m tox -e tests',
]
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


def section(text: str, heading: str, nested: bool = True) -> list[tuple[int, str]]:
    """(line number, line) of the prose under the first heading of ``text`` whose title is
    ``heading`` (any level), up to the next heading of the same level or above (any heading,
    unless ``nested``); [] where there is none."""
    lines = prose_lines(text)
    for i, (_, line) in enumerate(lines):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
        if m and m.group(2) == heading:
            level = len(m.group(1)) if nested else 6
            out = []
            for n, rest in lines[i + 1 :]:
                h = re.match(r"^(#{1,6})\s", rest)
                if h and len(h.group(1)) <= level:
                    break
                out.append((n, rest))
            return out
    return []


# docs/architecture.md's layout: a line for every module of these folders
LAYOUT_FOLDERS = ("conformance", "fixtures", "transforms", "tools")
LAYOUT_RULES = ROOT / "tests" / "unit" / "test_layout.py"
_BULLET = re.compile(r"^\s*[-*+]\s")
_MODULE_LINE = re.compile(r"^- `([^`]+)`: \S")
_MAY_IMPORT = "**May import**:"


def layout_modules(root: Path = ROOT) -> list[str]:
    """Every ``.py`` file of LAYOUT_FOLDERS, as a path from the repository's root."""
    return sorted(
        p.relative_to(root).as_posix()
        for folder in LAYOUT_FOLDERS
        for p in (root / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    )


def layout_rules(rules: Path = LAYOUT_RULES) -> tuple[dict[str, str], dict[str, set[str]], tuple[str, ...]]:
    """``ROLES``, ``ALLOWED`` and ``PACKAGES`` of the layout test, read with ``ast`` (the test
    module imports the kit; this does not)."""
    found = {}
    for node in ast.parse(rules.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id in ("ROLES", "ALLOWED", "PACKAGES"):
            found[target.id] = ast.literal_eval(node.value)
    return found["ROLES"], found["ALLOWED"], found["PACKAGES"]


def _role(path: str, roles: dict[str, str]) -> str | None:
    """The layout test's role of a module, folder or pattern written as a repository path
    (the first rule of ``roles`` whose prefix names it, as the test decides)."""
    parts = path.rstrip("/").removesuffix(".py").split("/")
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts).rstrip("*")
    for name, prefix in roles.items():
        if module == prefix or module.startswith(prefix if prefix.endswith("_") else prefix + "."):
            return name
    return None


def _under(path: str, heading: str) -> bool:
    return path.startswith(heading) if heading.endswith("/") else fnmatch.fnmatchcase(path, heading)


def layout_drift(doc: Path, root: Path = ROOT, rules: Path = LAYOUT_RULES) -> list[str]:
    """What docs/architecture.md's "Layout" does not say of the modules under ``root``:
    each module of LAYOUT_FOLDERS without a line (a package's ``__init__.py`` may go
    without), and each line for a module that is gone, listed twice, outside the folder its
    section names, or not a path from the repository's root; each section whose **May
    import** line is not what tests/unit/test_layout.py lets its modules import. A line is
    ``- `path/from/the/root.py`: its purpose``; a section is ``### `folder/` `` (or files, or
    a pattern), then its **May import** line, then its lines. Nothing is skipped: a bare file
    name, a pattern or a folder on a line is a finding."""
    name = doc.relative_to(root).as_posix()
    lines = section(doc.read_text(), "Layout")
    if not lines:
        return [f"{name}: no Layout section"]
    roles, allowed, packages = layout_rules(rules)
    out: list[str] = []
    listed: dict[str, int] = {}
    heads: list[str] = []
    may: set[str | None] | None = None
    section_roles: dict[str, int] = {}  # role -> first line of it in the current section
    head_line = 0

    def close() -> None:
        for role, n in section_roles.items():
            want = allowed[role] - {role}
            if may is None:
                out.append(f"{name}:{head_line}: its section has no {_MAY_IMPORT} line (line {n} is {role})")
            elif may != want:
                says = sorted(str(r) for r in may)
                out.append(
                    f"{name}:{head_line}: {_MAY_IMPORT} says {says}; tests/unit/test_layout.py lets {role} "
                    f"(line {n}) import {sorted(want)}"
                )

    for i, (n, line) in enumerate(lines):
        if line.startswith("### "):
            close()
            heads = [s.strip() for _, s in _CODE.findall(line)]
            may, section_roles, head_line = None, {}, n
            continue
        if line.startswith(_MAY_IMPORT):
            text = line
            for _, more in lines[i + 1 :]:
                if not more.strip() or _BULLET.match(more) or more.startswith("#"):
                    break
                text += " " + more
            may = {_role(s.strip(), roles) for _, s in _CODE.findall(text)}
            if None in may:
                out.append(f"{name}:{n}: {_MAY_IMPORT} names a path that is no role of tests/unit/test_layout.py")
            continue
        if not _BULLET.match(line):
            continue
        m = _MODULE_LINE.match(line)
        where = f"{name}:{n}"
        if not m:
            out.append(f"{where}: not a module line (- `path/from/the/root.py`: its purpose): {line.strip()[:60]}")
            continue
        path = m.group(1)
        where = f"{where}: {path}"
        if not (path.endswith(".py") and "/" in path and path.split("/")[0] in LAYOUT_FOLDERS):
            out.append(f"{where}: not a module of {', '.join(f + '/' for f in LAYOUT_FOLDERS)} from the root")
            continue
        if path in listed:
            out.append(f"{where}: listed again (first on line {listed[path]})")
            continue
        listed[path] = n
        if not (root / path).is_file():
            out.append(f"{where}: no such module")
            continue
        if not any(_under(path, h) for h in heads):
            out.append(f"{where}: not under its section's {heads or 'heading'}")
        role = _role(path, roles) if path.split("/")[0] in packages else None
        if role is not None:
            section_roles.setdefault(role, n)
    close()
    for path in layout_modules(root):
        if path not in listed and not path.endswith("/__init__.py"):
            out.append(f"{path}: no line in {name}'s Layout")
    return out


# each guarantee of a check area says what it is held to (the legend: README.md)
MARKS = ("*independent*", "*self-consistency*")
GUARANTEES = ("What it guarantees", "The bounds", "What a cell checks")


def unmarked_guarantees(doc: Path, root: Path = ROOT, both: bool = False) -> list[str]:
    """Each guarantee of ``doc`` that carries neither mark of MARKS (or, unless ``both``,
    both): under its first heading titled as in GUARANTEES, up to the next heading, every row
    of a table (not its header) and every list item that has no sub-items and no item above
    it carrying a mark."""
    name = doc.relative_to(root).as_posix()
    text = doc.read_text()
    lines = next((s for h in GUARANTEES if (s := section(text, h, nested=False))), [])
    if not lines:
        return [f"{name}: no section titled {' or '.join(GUARANTEES)}"]
    separator = re.compile(r"^\|[\s:|-]+\|\s*$")
    # (line number, line, indent): a table row has none; None ends a list
    entries: list[tuple[int, str, int | None] | None] = []
    for i, (n, line) in enumerate(lines):
        if line.startswith("|"):
            header = i + 1 < len(lines) and separator.match(lines[i + 1][1])
            if not header and not separator.match(line):
                entries.append((n, line, None))
        elif _BULLET.match(line):
            entries.append((n, line, len(line) - len(line.lstrip())))
        elif line.strip() and not line.startswith(" "):
            entries.append(None)  # a paragraph ends a list
    out = []
    above: list[tuple[int, bool]] = []  # (indent, marked) of the items enclosing this one
    for k, entry in enumerate(entries):
        if entry is None:
            above = []
            continue
        n, line, indent = entry
        found = [mark for mark in MARKS if mark in line]
        where = f"{name}:{n}: a {'row' if indent is None else 'list item'}"
        if len(found) == 2 and not both:
            out.append(f"{where} with both marks: {line.strip()[:60]}")
        if indent is None:
            if not found:
                out.append(f"{where} without a mark ({' or '.join(MARKS)}): {line.strip()[:60]}")
            continue
        while above and above[-1][0] >= indent:
            above.pop()
        nxt = entries[k + 1] if k + 1 < len(entries) else None
        leaf = nxt is None or nxt[2] is None or nxt[2] <= indent
        if leaf and not found and not any(m for _, m in above):
            out.append(f"{where} without a mark ({' or '.join(MARKS)}): {line.strip()[:60]}")
        above.append((indent, bool(found)))
    if not any(e is not None for e in entries):
        out.append(f"{name}: no guarantee under its heading")
    return out

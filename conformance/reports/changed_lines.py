"""The lines a change to Thunder touched: on the new side of a unified diff, what mutation
analysis restricts its mutants to (``--diff A..B``, read from ``git diff``); on the old side,
what a coverage map made before the change says about which cells run them (``--affected-by``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def from_unified_diff(text: str, side: str = "new") -> dict[str, set[int]]:
    """Path -> the lines a diff touched. ``new``: the new file's added or changed lines (a hunk
    that only deletes touches the line after the deletion, where the change now sits); ``old``:
    the old file's removed or changed lines (a hunk that only adds touches the lines on both
    sides of the insertion)."""
    changed: dict[str, set[int]] = {}
    old_path: str | None = None
    path: str | None = None
    for line in text.splitlines():
        if line.startswith("--- "):
            old_path = _file(line, "a/")
        elif line.startswith("+++ "):
            path = _file(line, "b/") if side == "new" else old_path
        elif path is not None and (m := _HUNK.match(line)):
            group = (1, 2) if side == "old" else (3, 4)
            start = int(m.group(group[0]))
            count = int(m.group(group[1])) if m.group(group[1]) is not None else 1
            if count:
                touched = set(range(start, start + count))
            else:
                touched = {max(start, 1)} if side == "new" else {max(start, 1), start + 1}
            changed.setdefault(path, set()).update(touched)
    return changed


def _file(header: str, prefix: str) -> str | None:
    """The path a ``---``/``+++`` header names (None for ``/dev/null``: no such side)."""
    name = header[4:].split("\t")[0]
    return None if name == "/dev/null" else name.removeprefix(prefix)


def from_path_lines(spec: str) -> dict[str, set[int]]:
    """``PATH:LINES`` (``thunder/distributed/utils.py:40-42,57``) -> {path: lines}."""
    path, sep, spans = spec.rpartition(":")
    if not sep or not path:
        raise ValueError(f"{spec!r} is neither a diff file nor PATH:LINES")
    lines: set[int] = set()
    for span in spans.split(","):
        first, _, last = span.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"{spec!r}: {span!r} is not a line or a range of lines")
        lines.update(range(int(first), int(last or first) + 1))
    return {path: lines}


def from_git(repo: Path, revisions: str, paths: list[str]) -> dict[str, set[int]]:
    """``revisions`` (``A..B``) in the git checkout ``repo``, restricted to ``paths``."""
    a, sep, b = revisions.partition("..")
    if not sep or not a or not b:
        raise ValueError(f"--diff takes A..B, got {revisions!r}")
    text = subprocess.run(
        ["git", "-C", str(repo), "diff", "-U0", "--no-color", "--no-ext-diff", a, b, "--", *paths],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return from_unified_diff(text)


def file_at(repo: Path, revision: str, path: str) -> str | None:
    """``path`` as it stands at ``revision`` in ``repo`` (None where it does not exist there)."""
    proc = subprocess.run(["git", "-C", str(repo), "show", f"{revision}:{path}"], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None

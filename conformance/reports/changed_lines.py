"""The lines a change to Thunder touched: on the new side of a unified diff, what mutation
analysis restricts its mutants to (``--diff A..B``, read from ``git diff``); on the old side,
what a coverage map made before the change says about which cells run them (``--affected-by``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def from_unified_diff(text: str, side: str = "new") -> dict[str, set[int]]:
    """Path -> the lines a diff touched. ``new``: the new file's added or changed lines (a run
    of lines that only deletes touches the new line before the deletion, where the change now
    sits); ``old``: the old file's removed or changed lines (a run that only adds touches the
    old lines on both sides of the insertion). Context lines (``git diff``'s default three,
    ``diff -u``'s) touch nothing: each hunk's body is read line by line, as its header counts."""
    changed: dict[str, set[int]] = {}
    old_path: str | None = None
    path: str | None = None
    old_left = new_left = old_no = new_no = 0
    removed: list[int] = []  # the current run of changed lines, on each side
    added: list[int] = []

    def flush() -> None:
        if path is not None and (removed or added):
            touched = (removed or [max(old_no - 1, 1), old_no]) if side == "old" else (added or [max(new_no - 1, 1)])
            changed.setdefault(path, set()).update(touched)
        removed.clear()
        added.clear()

    for line in text.splitlines():
        if old_left > 0 or new_left > 0:  # inside a hunk's body
            tag = line[:1]
            if tag == "\\":  # "\ No newline at end of file"
                continue
            if tag == "-":
                removed.append(old_no)
                old_no, old_left = old_no + 1, old_left - 1
            elif tag == "+":
                added.append(new_no)
                new_no, new_left = new_no + 1, new_left - 1
            else:  # context: the run of changes before it has ended
                flush()
                old_no, new_no, old_left, new_left = old_no + 1, new_no + 1, old_left - 1, new_left - 1
            if old_left <= 0 and new_left <= 0:
                flush()
            continue
        if line.startswith("--- "):
            old_path = _file(line, "a/")
        elif line.startswith("+++ "):
            path = _file(line, "b/") if side == "new" else old_path
        elif m := _HUNK.match(line):
            old_start, new_start = int(m.group(1)), int(m.group(3))
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            # a side of no lines names the line before the hunk: its next line is the one after
            old_no = old_start if old_left else old_start + 1
            new_no = new_start if new_left else new_start + 1
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

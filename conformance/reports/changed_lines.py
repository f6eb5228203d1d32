"""The lines a change to Thunder touched, as the new side of a unified diff numbers them:
what mutation analysis restricts its mutants to (``--diff A..B``), read from ``git diff``."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def from_unified_diff(text: str) -> dict[str, set[int]]:
    """Path (as the diff's ``+++ b/`` side names it) -> the new file's added or changed lines.
    A hunk that only deletes touches the line after the deletion, where the change now sits."""
    changed: dict[str, set[int]] = {}
    path: str | None = None
    for line in text.splitlines():
        if line.startswith("+++ "):
            name = line[4:].split("\t")[0]
            path = None if name == "/dev/null" else name.removeprefix("b/")
        elif path is not None and (m := _HUNK.match(line)):
            start, count = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
            changed.setdefault(path, set()).update(range(start, start + count) if count else {max(start, 1)})
    return changed


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

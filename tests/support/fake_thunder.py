"""A Thunder of two files for mutation analysis's tests without the installed one: its
``utils.py`` is ``SOURCE``, a module that asserts a constant at import (so that a mutant can
break the import) and one function."""

from __future__ import annotations

from pathlib import Path

SOURCE = "LIMIT = 1\nassert LIMIT == 1\n\n\ndef pad(rows, world):\n    return [rows, world][0] + LIMIT\n"
PATH = "thunder/distributed/utils.py"


def fake_thunder(tmp_path: Path) -> Path:
    """The folder that holds the fake ``thunder`` package, as an installed one's parent."""
    root = tmp_path / "site"
    (root / "thunder" / "distributed").mkdir(parents=True)
    (root / "thunder" / "__init__.py").write_text("")
    (root / "thunder" / "distributed" / "__init__.py").write_text("")
    (root / PATH).write_text(SOURCE)
    return root

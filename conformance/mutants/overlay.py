"""The overlay: a copy of the Thunder under test that the suite imports first (PYTHONPATH), in
which one file at a time is mutated. The installed Thunder is only ever read.

A copy, not links: the kit blames a raise on Thunder by where its frames' files resolve to
(conformance/frontend/blame.py), and a link would resolve into the installed package. The
mutated file's compiled module is deleted before and after each trial, and the file gets an
mtime of its own, so that no .pyc of another version of it can pass for it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from conformance.mutants.sites import Mutant
from conformance.reports import environment


def installed_thunder() -> Path:
    """The folder that holds the ``thunder`` package this interpreter would import."""
    package = environment.thunder_package()
    if package is None:
        raise RuntimeError("no Thunder is installed beside the kit")
    return package.parent


class Overlay:
    """``root/thunder``: the copy; ``root`` goes first on the suite's PYTHONPATH."""

    def __init__(self, root: Path, source: Path) -> None:
        self.root = root
        self.source = source  # the installed Thunder's parent folder
        self._trials = 0
        self.restored: list[str] = []
        if not (root / "thunder").is_dir():
            root.mkdir(parents=True, exist_ok=True)
            shutil.copytree(source / "thunder", root / "thunder", ignore=shutil.ignore_patterns("__pycache__"))
        else:  # an analysis killed inside a trial leaves its mutant behind: every later trial would carry it
            self.restored = self.restore()

    def restore(self) -> list[str]:
        """Make every source file of the copy the installed one again; the paths it mended."""
        mended = []
        for installed in sorted((self.source / "thunder").rglob("*.py")):
            path = installed.relative_to(self.source).as_posix()
            target = self.root / path
            if target.is_file() and target.read_bytes() == installed.read_bytes():
                continue
            Path(importlib.util.cache_from_source(str(target))).unlink(missing_ok=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(installed, target)
            mended.append(path)
        return mended

    def environment(self) -> dict[str, str]:
        """What a process must be given to import the overlay's Thunder first."""
        rest = os.environ.get("PYTHONPATH")
        return {"PYTHONPATH": str(self.root) + (os.pathsep + rest if rest else "")}

    @contextlib.contextmanager
    def applied(self, mutant: Mutant, text: str) -> Iterator[Path]:
        """The overlay with ``mutant``'s file replaced by ``text`` while the block runs."""
        target = self.root / mutant.path
        original = (self.source / mutant.path).read_text()
        stat = (self.source / mutant.path).stat()
        self._trials += 1
        compiled = Path(importlib.util.cache_from_source(str(target)))
        try:
            compiled.unlink(missing_ok=True)
            target.write_text(text)
            # an mtime no other version of this file had: a stale .pyc can never match it
            fake = 1_000_000_000 + os.getpid() % 10_000 * 100_000 + self._trials
            os.utime(target, (fake, fake))
            yield target
        finally:
            compiled.unlink(missing_ok=True)
            target.write_text(original)
            os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))

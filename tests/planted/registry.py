"""Every planted bug, collected from the family modules of this package (each module-level
``PlantedBug`` record), and the rank-side entry point that plants one for a cell.

Adding a bug is adding one record to a family module (or a new module here): nothing else
names it."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from typing import Any

from tests.planted.record import PlantedBug

# modules of this package that hold no records (tests are never imported in the ranks)
_NOT_FAMILIES = {"cells", "patching", "record", "registry"}


def family_modules() -> list[str]:
    """The modules of this package that may hold records, by name."""
    import tests.planted

    return [
        f"{tests.planted.__name__}.{m.name}"
        for m in pkgutil.iter_modules(tests.planted.__path__)
        if m.name not in _NOT_FAMILIES and not m.name.startswith("test_")
    ]


def walk() -> list[PlantedBug]:
    """Every record each family module holds, in module order (a record imported into a
    second module is listed twice: the registry's test refuses that)."""
    found = []
    for name in family_modules():
        found += [v for v in vars(importlib.import_module(name)).values() if isinstance(v, PlantedBug)]
    return found


RECORDS: tuple[PlantedBug, ...] = tuple(walk())
BUGS: dict[str, PlantedBug] = {bug.name: bug for bug in RECORDS}


def run_cell_with_bug(
    bug: str, axes: dict[str, Any], declared: Sequence[str] = (), plain_jit: bool = True, checkpoint: str | None = None
) -> dict[str, Any]:
    from conformance.rank import plain_jit
    from conformance.rank.entry import run_cell

    with plain_jit.variant(bug), BUGS[bug].patch():
        return run_cell(axes, declared, plain_jit, checkpoint)


def save_with_bug(bug: str, axes: dict[str, Any], directory: str) -> dict[str, Any]:
    """A resharded resume's saving world, the bug planted there too."""
    from conformance.rank.scenarios.resharded import save

    with BUGS[bug].patch():
        return save(axes, directory)

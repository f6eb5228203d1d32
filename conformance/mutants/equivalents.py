"""The reviewed equivalents file (``mutants-equivalent.toml``): mutants that no program can tell
from Thunder on any input, each with the one-line argument why, and the kit's blind spots:
mutants that only the kit's inputs cannot tell apart, each with the input that would.

::

    [[equivalent]]
    mutant = "thunder/distributed/utils.py@0123456789ab:42:core/AddNot#3"
    why = "the check it negates always holds: the list is built two lines above"

    [[blind_spot]]
    mutant = "thunder/distributed/__init__.py@0123456789ab:121:core/AddNot#2"
    why = "every module the kit composes holds its process group in both places the line reads"
    input = "a ThunderModule whose compile data names another process group than the module"

An equivalent is set aside; a blind spot is judged like any mutant (a survivor while the kit
cannot see it: the score counts it so) and reported with its input.

A mutant id names the source it was made of (its file's hash): an entry for another source
(another Thunder) does not apply here and is skipped; an entry for this source that names no
mutant, or gives no reason, is an error, so that the file cannot rot silently.

An argument that holds only where the ranks hold their tensors on one kind of device (a move
to the CPU of a tensor already there) says so: ``devices = ["cpu"]``. It sets the mutant
aside only in an analysis whose ranks run there; elsewhere the mutant is judged by its trial.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from conformance.mutants.sites import Mutant


class EquivalentsError(ValueError):
    """The equivalents file cannot be used: one line saying why."""


DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class Equivalent:
    mutant: str
    why: str
    devices: tuple[str, ...] = DEVICES  # where the argument holds


def load(path: Path | None, every: list[Mutant], device: str = "cpu") -> dict[str, Equivalent]:
    """Mutant id -> its entry, for the entries about this Thunder's sources that hold on
    ``device`` (where the analysis's ranks hold their tensors); ``every``: all mutants of the
    files in scope (whose ids name each file's source)."""
    found: dict[str, Equivalent] = {}
    for where, mutant, why, raw in _entries(path, every, "equivalent"):
        devices = raw.get("devices", list(DEVICES))
        if not isinstance(devices, list) or not devices or not set(devices) <= set(DEVICES):
            raise EquivalentsError(f"{where}: 'devices' must list some of {', '.join(DEVICES)}")
        if device in devices:
            found[mutant] = Equivalent(mutant, why, tuple(devices))
    return found


@dataclasses.dataclass(frozen=True)
class BlindSpot:
    """A mutant only the kit's inputs cannot tell from Thunder: judged like any other (a
    survivor while the kit stays blind), reported with the input that would show it."""

    mutant: str
    why: str  # why the kit's inputs cannot show it
    input: str  # an input, a model or a call that would tell it from Thunder


def blind_spots(path: Path | None, every: list[Mutant]) -> dict[str, BlindSpot]:
    """Mutant id -> its ``[[blind_spot]]`` entry, for the entries about this Thunder's sources."""
    found: dict[str, BlindSpot] = {}
    for where, mutant, why, raw in _entries(path, every, "blind_spot"):
        shown_by = str(raw.get("input", "")).strip()
        if not shown_by:
            raise EquivalentsError(f"{where}: {mutant} names no 'input' that would show it")
        found[mutant] = BlindSpot(mutant, why, shown_by)
    return found


def _entries(path: Path | None, every: list[Mutant], table: str) -> list[tuple[str, str, str, dict]]:
    """(where, mutant id, why, the raw entry) for each entry of ``table`` about this Thunder's
    sources: one that names no mutant of them, or gives no reason, is an error."""
    if path is None or not path.exists():
        return []
    sources = {m.path: m.source for m in every}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise EquivalentsError(f"{path}: {exc}") from None
    known = {m.id for m in every}
    out = []
    for i, raw in enumerate(data.get(table, [])):
        where = f"{path}: {table} entry {i + 1}"
        mutant, why = raw.get("mutant"), str(raw.get("why", "")).strip()
        if not isinstance(mutant, str) or "@" not in mutant:
            raise EquivalentsError(f"{where}: 'mutant' must be a mutant id (path@source:line:operator#n)")
        if not why:
            raise EquivalentsError(f"{where}: {mutant} gives no reason ('why')")
        file, _, rest = mutant.partition("@")
        if sources.get(file) != rest.partition(":")[0]:
            continue  # about another source of that file: not this Thunder's
        if mutant not in known:
            raise EquivalentsError(f"{where}: {mutant} names no mutant of this source")
        out.append((where, mutant, why, raw))
    return out

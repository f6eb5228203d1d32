"""Whose code raised: the kit's or Thunder's.

A maintainer reading a red item must know whom to blame. An exception is Thunder's when the
innermost frame of the kit's or Thunder's code on its traceback is Thunder's (Thunder called
torch, which raised: still Thunder's); it is the kit's when that frame is the kit's: a check
that crashed on what Thunder produced, or an assumption about Thunder's API that this
version does not meet (``TraceTag.BACKWARD`` on 0.2.1), and also a kit transform that
Thunder called. Frames of torch, the standard library and pytest decide nothing, nor do the
frames of the kit's instrumentation (``INSTRUMENTATION``) through which Thunder's calls pass
without the kit deciding anything there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from conformance.reports import environment
from conformance.world.launch import ROOT

KIT_PACKAGES = ("conformance", "fixtures", "transforms")
KIT = "kit"
THUNDER = "thunder"

# The kit's instrumentation: (file under the kit's root, function) of code that wraps Thunder's
# calls only to observe them. The allocation tracker's dispatch mode (rank/measure.py) forwards every torch op that
# Thunder issues while a phase is measured, so torch raising there raises through its frame:
# Thunder's call all the same. Such a frame is passed over where it called something that raised;
# where it raised itself (the innermost frame of the traceback), it is the kit's. A kit test
# holds the list to every dispatch or function mode the kit defines.
# The waits' wrappers (rank/waits.py) hand Thunder's own torch.distributed calls, and the waits
# on what they return, through unchanged.
INSTRUMENTATION: frozenset[tuple[str, str]] = frozenset(
    {
        ("conformance/rank/measure.py", "__torch_dispatch__"),
        ("conformance/rank/waits.py", "call"),
        ("conformance/rank/waits.py", "coalescing"),
        ("conformance/rank/waits.py", "wait"),
    }
)


class KitError(Exception):
    """The kit's own code failed: reported as a pytest error, never as Thunder's failure."""


@dataclasses.dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        path = Path(self.file)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        return f"{shown}:{self.line} in {self.function}"


@dataclasses.dataclass(frozen=True)
class Blame:
    owner: str | None  # KIT, THUNDER, or None where neither's code is on the traceback
    frame: Frame | None  # the innermost frame of the owner's code


def _thunder_root() -> Path | None:
    """Where the Thunder under test lives."""
    return environment.thunder_package()


def owner_of(file: str, thunder_root: Path | None) -> str | None:
    path = Path(file).resolve()
    if thunder_root is not None and path.is_relative_to(thunder_root):
        return THUNDER
    if any(path.is_relative_to(ROOT / package) for package in KIT_PACKAGES):
        return KIT
    return None


def instrumentation(frame: Frame) -> bool:
    """Whether ``frame`` is one of the kit's instrumentation functions (``INSTRUMENTATION``)."""
    path = Path(frame.file).resolve()
    if not path.is_relative_to(ROOT):
        return False
    return (path.relative_to(ROOT).as_posix(), frame.function) in INSTRUMENTATION


def in_thunder(frame: Frame) -> str:
    """``frame``'s file from Thunder's package on (``thunder/executors/torchex.py``), as an
    xfails entry's ``raises`` names it; the file as it is where it is not Thunder's."""
    root = _thunder_root()
    path = Path(frame.file).resolve()
    return path.relative_to(root.parent).as_posix() if root is not None and path.is_relative_to(root) else frame.file


def blame(frames: Iterable[Mapping[str, Any]] | None) -> Blame:
    """The owner of the innermost frame that is the kit's or Thunder's (frames outermost first),
    the kit's instrumentation passed over where it only forwarded a call that raised."""
    thunder_root = _thunder_root()
    listed = [Frame(str(raw["file"]), int(raw["line"]), str(raw["function"])) for raw in frames or ()]
    for depth, frame in enumerate(reversed(listed)):
        owner = owner_of(frame.file, thunder_root)
        if owner is None or (owner == KIT and depth > 0 and instrumentation(frame)):
            continue
        return Blame(owner, frame)
    return Blame(None, None)

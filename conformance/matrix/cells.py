"""A cell: one point of the matrix, named so that its pytest id spells every axis."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from fixtures import checkpointing

# Axis order is the order of the id's parts.
AXES = (
    "model",
    "init",
    "composition",
    "tie",
    "offload",
    "sharding",
    "bucketing",
    "dtype",
    "executors",
    "checkpointing",
    "scenario",
    "world_size",
)
DEFAULT_EXECUTORS = "default"
DEFAULT_SCENARIO = "train"
DEFAULT_CHECKPOINTING = checkpointing.NONE
# Axes added after ids were first compared across runs: at their default value they are left
# out of the id and of ``Cell.axes()``, so every cell that existed before them keeps its id
# (baselines and history compare by id).
QUIET_DEFAULTS = {
    "executors": DEFAULT_EXECUTORS,
    "checkpointing": DEFAULT_CHECKPOINTING,
    "scenario": DEFAULT_SCENARIO,
}


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str
    init: str
    composition: str
    tie: str = "untied"
    offload: str = "none"
    sharding: str = "zero2"
    bucketing: str = "none"
    dtype: str = "float32"
    executors: str = DEFAULT_EXECUTORS
    checkpointing: str = DEFAULT_CHECKPOINTING  # fixtures/checkpointing.py
    scenario: str = DEFAULT_SCENARIO
    world_size: int = 2
    spec: str | None = None  # JSON structure of a generated model (fixtures/strategies.py)
    # a world of ``world_size`` ranks acted out under torch's fake process group, a few
    # sampled ranks standing for all (conformance/rank/simulate.py); its id ends in ``sim``
    simulated: bool = False
    # a resharded resume (scenario ``resume``): the checkpoint is taken at this many ranks, in a
    # world of its own, and resumed at ``world_size`` (conformance/matrix/resharded.py); its id
    # ends in ``ws{saved_at}to{world_size}``
    saved_at: int | None = None

    @property
    def id(self) -> str:
        parts = [str(getattr(self, axis)) for axis in AXES[:-1] if not self._quiet(axis)]
        saved = f"{self.saved_at}to" if self.saved_at is not None else ""
        parts.append(f"ws{saved}{self.world_size}" + ("sim" if self.simulated else ""))
        if self.spec is not None:
            parts.append(hashlib.sha1(self.spec.encode()).hexdigest()[:8])
        return "-".join(parts)

    def axes(self) -> dict[str, str | int]:
        """The cell as JSON-able keyword arguments (a generated model's spec included)."""
        out = dataclasses.asdict(self)
        if self.spec is None:
            del out["spec"]
        if not self.simulated:
            del out["simulated"]
        if self.saved_at is None:
            del out["saved_at"]
        for axis in QUIET_DEFAULTS:
            if self._quiet(axis):
                del out[axis]
        return out

    def _quiet(self, axis: str) -> bool:
        return axis in QUIET_DEFAULTS and getattr(self, axis) == QUIET_DEFAULTS[axis]

    def __str__(self) -> str:
        return self.id


def axis_value(axes: dict[str, Any], axis: str) -> Any:
    """``axis`` of a cell given as ``Cell.axes()`` wrote it: an axis left out (one at its
    default, or one a report older than the axis never wrote) has its default value."""
    if axis in axes:
        return axes[axis]
    return {f.name: f.default for f in dataclasses.fields(Cell)}[axis]

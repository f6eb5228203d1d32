"""A cell: one point of the matrix, named so that its pytest id spells every axis."""

from __future__ import annotations

import dataclasses
import hashlib

# Axis order is the order of the id's parts.
AXES = ("model", "init", "composition", "tie", "offload", "sharding", "bucketing", "dtype", "world_size")


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
    world_size: int = 2
    spec: str | None = None  # JSON structure of a generated model (fixtures/strategies.py)
    # a world of ``world_size`` ranks acted out under torch's fake process group, a few
    # sampled ranks standing for all (conformance/rank/simulate.py); its id ends in ``sim``
    simulated: bool = False

    @property
    def id(self) -> str:
        parts = [str(getattr(self, axis)) for axis in AXES]
        parts[-1] = f"ws{self.world_size}" + ("sim" if self.simulated else "")
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
        return out

    def __str__(self) -> str:
        return self.id

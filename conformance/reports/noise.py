"""How much each metric of a report moves between two runs of the same code: a difference
within it is noise, one beyond it a change.

Measured, not guessed: runs of the ci profile on the pin compared pairwise (the figures are
in docs/measurements.md, *Run-to-run noise*). Setup, backward and optimizer-step peaks, what
the forward leaves allocated, collective counts and all-gathered bytes repeat exactly. The
forward peak does not: gloo's work objects release all-gather buffers on the communication
thread's own schedule, so a buffer is sometimes still counted when the forward reaches its
peak. Timings move with the load of other processes.

Each threshold sits above the worst figure seen: exact where nothing moved; the forward peak
beyond 1 KiB and 1%; timings beyond 1.5 times the worst ratio and 1 s. On CUDA, where
``max_memory_allocated`` may move differently, or on a quiet machine, where timings move
less, they should be measured again.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Noise:
    """Two readings differ beyond noise when the larger exceeds ``factor`` times the smaller and
    their difference exceeds ``absolute`` (both: small timings jump by large factors, large
    ones by many seconds)."""

    factor: float
    absolute: float
    unit: str

    def beyond(self, old: float, new: float) -> bool:
        lo, hi = sorted((old, new))
        return hi - lo > self.absolute and hi > self.factor * lo

    def describe(self) -> str:
        if self.factor == 1 and self.absolute == 0:
            return "exact"
        ratio = f"{self.factor - 1:.0%}" if self.factor < 2 else f"×{self.factor:g}"
        return f"more than {self.absolute:g} {self.unit} and {ratio}"


EXACT_BYTES = Noise(factor=1.0, absolute=0, unit="B")
# the forward's peak: gloo releases all-gather buffers late
# calibrated on a measurement: six ci runs, the forward peak up to +960 B, 0.38% from 8 KB (2026-11-22):
# docs/measurements.md#run-to-run-noise
FORWARD_PEAK = Noise(factor=1.01, absolute=1024, unit="B")
EXACT_COUNT = Noise(factor=1.0, absolute=0, unit="")
# calibrated on a measurement: six ci runs, a cell's run up to x5.39 and a phase up to x9.0 beyond 1 s, each
# threshold 1.5 times that (2026-11-22): docs/measurements.md#run-to-run-noise
CELL_TIME = Noise(factor=8.0, absolute=1.0, unit="s")
PHASE_TIME = Noise(factor=14.0, absolute=1.0, unit="s")

MEMORY, COLLECTIVES, TIMING = "memory", "collectives", "timing"


def noise(kind: str, metric: str) -> Noise:
    """The threshold of one metric of a report (kind: MEMORY, COLLECTIVES or TIMING)."""
    if kind == MEMORY:
        return FORWARD_PEAK if metric == "forward peak" else EXACT_BYTES
    if kind == COLLECTIVES:
        return EXACT_COUNT
    return CELL_TIME if metric in ("cell_run_s", "duration") else PHASE_TIME


def thresholds() -> dict[str, Noise]:
    """Every threshold by what it applies to (for the reports' tables)."""
    return {
        "memory: setup, backward, step peaks; held after forward": EXACT_BYTES,
        "memory: forward peak": FORWARD_PEAK,
        "collectives: counts and all-gathered bytes": EXACT_COUNT,
        "timing: cell_run_s (a cell's run), an item's duration": CELL_TIME,
        "timing: entries of timings (setup_s, stepN_s)": PHASE_TIME,
    }

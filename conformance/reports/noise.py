"""How much each metric of a report moves between two runs of the same code: a difference
within it is noise, one beyond it a change.

Measured, not guessed: six runs of the ci profile on the pin (lightning-thunder
0.2.7.dev20260201, torch 2.11.0, gloo, 2 ranks on the 2-core CPU machine, other work running
beside them; walls 239 to 530 s; 285 items each, identical outcomes but for one memory item
of the first run that an ensuing fix of the kit made pass), compared pairwise (15 pairs;
timings as 30 ordered pairs):

- memory peaks (``measured`` of the 48 memory items: 720 comparisons per phase): setup,
  backward and optimizer-step peaks identical in every comparison; the forward peak differed
  in 64, on 11 cells, by at most 960 B (an mlp cell: 2272 or 3232 B, 42%) and, on the 375
  comparisons of peaks of 8 KB and more, by at most 32 B (0.38%). gloo's work objects release
  all-gather buffers on the communication thread's own schedule, so a buffer is sometimes
  still counted when the forward reaches its peak. Six older runs of a smaller ci profile
  (two sets of three, 87 comparisons each) agree: setup, backward and step identical, forward
  up to 608 B (27%).
- what the forward leaves allocated (``held after forward`` of the 36 offload items, 540
  comparisons): identical.
- collective counts and all-gathered bytes (48 collectives items, 720 comparisons per
  metric): identical.
- timings (11,610 ordered comparisons): ``cell_run_s`` grew by up to x5.39 (a cell
  2.6 s → 13.9 s; 40 s more in another at x5.3); entries of ``timings`` (setup_s, step0_s …
  step5_s) by up to x9.0 where they grew by more than 1 s, and by up to x68 where they grew
  by 0.21 s at most (setup_s 3 ms → 210 ms). Load from other processes dominates: dividing
  by the run's median ratio does not narrow it (x4.58 for cell_run_s over four of the runs).

Each threshold sits above the worst figure seen: exact where nothing moved; the forward peak
beyond 1 KiB and 1%; timings beyond 1.5 times the worst ratio (x8 for a cell's run, x14 for one
phase) and 1 s. Nothing was measured on CUDA, where ``max_memory_allocated`` may move
differently, nor on a quiet machine, where timings move less.
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
# the forward's peak: gloo releases all-gather buffers late (worst seen +960 B; 0.38% from 8 KB)
FORWARD_PEAK = Noise(factor=1.01, absolute=1024, unit="B")
EXACT_COUNT = Noise(factor=1.0, absolute=0, unit="")
CELL_TIME = Noise(factor=8.0, absolute=1.0, unit="s")  # worst seen ×5.39
PHASE_TIME = Noise(factor=14.0, absolute=1.0, unit="s")  # worst seen ×9.0 beyond 1 s

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

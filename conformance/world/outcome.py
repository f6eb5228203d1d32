"""What one task on a world came to: every rank's answer, and who is to blame where some
rank did not pass (conformance/world/controller.py makes them)."""

from __future__ import annotations

import dataclasses

from conformance.world import protocol

# Who caused a failure and who merely suffered it: a death explains a peer's "connection
# closed by peer", never the other way round; a dead or stopped rank explains a peer's raise (a
# collective whose other end went away). A stop comes first: it is sent from outside the world,
# so nothing a peer did explains it, and it explains a peer's death (a collective watchdog
# aborting the process whose peer never joined).
_BLAME_ORDER = {
    protocol.STOPPED: 0,
    protocol.DIED: 1,
    protocol.FAILED: 2,
    protocol.TIMEOUT: 3,
    protocol.ABORTED: 4,
    protocol.PASSED: 5,
}


@dataclasses.dataclass
class Outcome:
    """Every rank's answer to one task."""

    results: list[protocol.RankResult]
    duration: float  # the task itself, not counting a world start
    startup: float  # seconds spent starting a world for this task (0 when reused)

    @classmethod
    def not_started(cls, error: str, died: tuple[int, ...], size: int, phase: str, startup: float) -> Outcome:
        """A world that did not start: the ranks seen to die first are why, their peers were
        stopped waiting on them (torchrun kills them); none seen, every rank failed to start."""
        status = {r: protocol.DIED if r in died else protocol.ABORTED if died else protocol.FAILED for r in range(size)}
        return cls([protocol.RankResult(r, status[r], error=error, phase=phase) for r in range(size)], 0.0, startup)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def values(self) -> list[object]:
        return [r.value for r in self.results]

    def culprits(self) -> list[protocol.RankResult]:
        # of ranks that timed out, one found stopped is why the others waited
        return sorted(
            (r for r in self.results if not r.ok), key=lambda r: (_BLAME_ORDER[r.status], not r.stopped, r.rank)
        )

    def describe(self, names: list[int] | None = None) -> str:
        """Each culprit's evidence; ``names``: what to call each process's rank, where it
        stood for another (a simulated world's sampled ranks)."""
        parts = []
        for r in self.culprits():
            during = f" during {r.phase}" if r.phase else ""
            parts.append(
                f"--- rank {names[r.rank] if names else r.rank}: {r.status} after {r.duration:.1f}s{during} ---"
            )
            for title, body in (("error", r.error), ("stacks", r.stacks), ("log tail", r.log_tail)):
                if body and body.strip():
                    parts.append(f"[{title}]\n{body.rstrip()}")
        return "\n".join(parts)

"""Numerics' judgement of DDP's replicas: every rank holds the whole model and steps it with
the same averaged gradients and the same optimizer, so after every step the ranks' gradients
and parameters must be identical bit for bit (conformance/rank/gather.py: ``apart_from_rank0``).

No tolerance: an all-reduce hands every rank the same result, and the same optimizer on the
same values computes the same bits. A replica one ulp off passes every comparison with eager
PyTorch (1e-5 in float32), yet from then on the ranks train different models.
"""

from __future__ import annotations

from conformance.checks.findings import Findings
from conformance.checks.record import Apart, StepRecord


def judge_replicas(found: Findings, k: int, step: StepRecord, failed: set[str]) -> None:
    """Step ``k``'s gradients and parameters against rank 0's on every rank; each kind is
    reported at the first step where it comes apart (added to ``failed``)."""
    assert step.replicas is not None, f"kit: no replicas recorded at step {k} of a replicated composition"
    for kind, apart in (("gradients", step.replicas.gradients), ("parameters", step.replicas.parameters)):
        key = f"replicas' {kind}"
        if key in failed or not apart:
            continue
        failed.add(key)
        where = "; ".join(f"[{name}] {_ranks(apart[name])}" for name in sorted(apart))
        message = f"replicas at step {k} ({step.optimizer}): {kind} differ from rank 0's bit for bit: {where}"
        fields = {"step": k, "optimizer": step.optimizer, "quantity": kind, "names": sorted(apart)}
        found.fail("numerics.replicas", message, **fields)


def _ranks(apart: list[Apart]) -> str:
    return ", ".join(
        f"on rank {a.rank} ({a.elements} element{'s' if a.elements != 1 else ''}, by up to {a.largest:.3g})"
        for a in apart
    )

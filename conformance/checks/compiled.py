"""Compiled: what reached Thunder of a model composed with PyTorch's parallelism, from
Thunder's and Dynamo's own reports (``conformance/rank/reached.py``).

Judged:
- Thunder compiled and ran something (independent: a composition whose point is that Thunder
  compiles the model, where Dynamo or ThunderFX sent all of it to eager, trains right and
  tests nothing of Thunder);
- against an earlier run of the cell (--baseline): Thunder compiled fewer functions, or split
  the captured graphs more often, than there (self-consistency over time: a block sent to eager
  that used to compile).

Under tensor parallelism, also: every call of a Linear the plan parallelizes ran in a piece
Thunder compiled (independent: the plan and eager's forward say how many calls there are;
ThunderFX's own report says which compiler each piece of the graph went to). A DTensor op
Thunder cannot take is split off to the fallback, which computes it right: only this shows it.

Reported in the cell's metrics: the functions Thunder compiled, the graphs handed to eager
whole, every split with its reason and Dynamo's graph breaks by reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from conformance.checks.area import Area, Noise
from conformance.checks.findings import Failure, Findings
from conformance.checks.record import CellRecord, TensorParallelRecord

# metric -> the direction a regression moves it (fewer compiled, more splits or eager graphs)
_FELL_BACK = {"thunder compiled": -1, "splits": 1, "eager graphs": 1, "graph breaks": 1}


def check(run: CellRecord) -> Findings:
    found = Findings()
    reached = run.reached
    if reached is None:  # the rank recorded nothing of what it compiled
        found.fail("compiled.unrecorded", "what reached Thunder: nothing recorded of what Thunder compiled")
        return found
    found.metrics.update(
        {
            "thunder compiled": reached.compiled,
            "eager graphs": reached.eager_graphs,
            "splits": len(reached.splits),
            "graph breaks": sum(reached.graph_breaks.values()),
            "split reasons": reached.splits,
            "graph break reasons": reached.graph_breaks,
        }
    )
    with found.expect("compiled.nothing", "what reached Thunder"):
        assert reached.compiled > 0, (
            "Thunder compiled nothing the cell ran: every part of the model ran eager "
            f"({reached.eager_graphs} graphs handed to eager whole; splits: {'; '.join(reached.splits) or '-'}; "
            f"graph breaks: {'; '.join(reached.graph_breaks) or '-'})"
        )
    return found


# the op a Linear's call is in a captured graph (torch.nn.functional.linear)
LINEAR = "linear"
THUNDER = "THUNDER"


def check_tensor_parallel(run: TensorParallelRecord) -> Findings:
    found = check(run)  # type: ignore[arg-type]  # reads ``reached`` alone
    reached = run.reached
    if reached is None:
        return found
    planned = sum(len(layer.calls) for layer in run.layers)
    in_thunder = reached.ops_by_compiler.get(THUNDER, {}).get(LINEAR, 0)
    outside = {c: ops[LINEAR] for c, ops in reached.ops_by_compiler.items() if c != THUNDER and ops.get(LINEAR)}
    found.metrics["linear calls"] = {"planned": planned, "in Thunder": in_thunder, "outside Thunder": outside}
    elsewhere = sum(outside.values())
    derived = {"planned": planned}
    what = "the plan's Linears in Thunder"
    with found.expect("compiled.split_off", what, derived, outside=elsewhere):
        assert in_thunder >= planned and not outside, (
            f"{planned} calls of the Linears the plan parallelizes ran per forward; Thunder compiled "
            f"{in_thunder} Linear calls, "
            + (", ".join(f"{n} went to {c}" for c, n in outside.items()) or "none went elsewhere")
            + f" (splits: {'; '.join(dict.fromkeys(reached.splits)) or '-'})"
        )
    return found


def fell_back(before: Mapping[str, float], now: Findings, noise: Callable[[str], Noise]) -> list[Failure]:
    """Less of the model reached Thunder than in an earlier run of the cell (--baseline): these
    counts do not move between runs of the same code, so any change is one."""
    found = []
    for metric, worse in _FELL_BACK.items():
        old, new = before.get(metric), now.metrics.get(metric)
        if old is None or new is None or (new - old) * worse <= 0:
            continue
        moved = "fell" if worse < 0 else "grew"
        message = f"what reached Thunder: {metric} {moved} from {old:g} to {new:g} over the baseline"
        found.append(Failure("compiled.fell_back", message, {"metric": metric, "before": old, "measured": new}))
    return found


AREA = Area(
    "compiled",
    check,
    against_baseline=fell_back,
    parallelisms=frozenset({"torch"}),
    tensor_parallel=check_tensor_parallel,
)

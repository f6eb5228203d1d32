"""Peaks along the plan (conformance/checks/memory/liveness.py): a real FSDP module's forward and backward,
measured by the rank's own tracker, allocate exactly what the walk of their final traces
predicts; a runtime that keeps one tensor past its ``del`` is over it by that tensor."""

from __future__ import annotations

import json
import subprocess
import sys

# mlp's layers sharded over 4 ranks of torch's fake process group (collectives move nothing,
# but Thunder allocates their outputs as on a real world). KEEP names a tensor the runtime
# is made to keep past its last use: ``torch.exp``'s output in the backward, held by a list.
_STEP = """
import json, os, sys, torch, torch.distributed as dist, thunder
from torch.testing._internal.distributed.fake_pg import FakeStore
from thunder.distributed import FSDPType, fsdp
from conformance.checks.memory.liveness import handed_to_backward, sized, walk
from conformance.rank.eager import loss, loss_region
from conformance.rank.measure import Ledger
os.environ["LOCAL_RANK"] = "0"
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 7))
tm = fsdp(thunder.jit(m), device=torch.device("cpu"), sharding_strategy=FSDPType.ZERO2)
x, cpu = torch.randn(3, 8), torch.device("cpu")
cot = torch.randn(3, 7)
loss(tm(x), cot).backward()  # compiles
tm.zero_grad(set_to_none=True)  # as the rank's steps end: the next gradients are new tensors
kept = []
if sys.argv[1] == "keep":
    exp = torch.exp
    torch.exp = lambda *a, **k: kept.append(exp(*a, **k)) or kept[-1]
ledger = Ledger(cpu)  # as the rank reads: one tracker across both phases sees the saved tensors freed
with ledger.phase() as forward:
    out = tm(x)
region = loss_region(out, cot, cpu)
with ledger.phase() as backward:
    loss(out, cot).backward()
    del out
f = walk(thunder.last_traces(tm)[-1], cpu)
b = walk(thunder.last_backward_traces(tm)[-1], cpu, handed_to_backward(f, cpu))
print(json.dumps({
    "forward": [forward.peak, f.peak], "alive": [forward.alive, f.end],
    "backward": [backward.peak - forward.alive, max(region.peak, region.handed + b.peak)],
    "sized": [s.name for s in sized(b, 3 * 16 * 4)],
}))
"""


def _step(how: str) -> dict[str, list]:
    out = subprocess.run([sys.executable, "-c", _STEP, how], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_runtime_allocates_along_the_plan_to_the_byte() -> None:
    got = _step("plain")
    for phase in ("forward", "alive", "backward"):
        measured, planned = got[phase]
        assert measured == planned, (phase, got)


def test_a_tensor_kept_past_its_del_is_over_the_plan_by_its_bytes() -> None:
    got = _step("keep")
    assert got["forward"][0] == got["forward"][1]  # the forward calls no exp
    measured, planned = got["backward"]
    # GELU's backward exps one 3 x 16 float32 tensor; kept, it stays to the end of the phase
    assert measured - planned == 3 * 16 * 4, got
    assert got["sized"], "the plan names the tensors of that size it drops"


# the plan read against its own data flow and against FSDP's arithmetic: mlp under ZERO2 on
# the fake world, compiled plain or under one of the planted plan bugs (tests/planted/against_plan.py)
_PLAN = """
import contextlib, json, os, sys, torch, torch.distributed as dist, thunder
from torch.testing._internal.distributed.fake_pg import FakeStore
from thunder.distributed import FSDPType, fsdp
from conformance.checks.findings import Findings
from conformance.checks.memory.against_plan import shards_returned_uncopied
from conformance.checks.memory.liveness import handed_to_backward, walk
from tests.planted import against_plan
os.environ["LOCAL_RANK"] = "0"
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 7))
cpu = torch.device("cpu")
with getattr(against_plan, sys.argv[1]).patch() if sys.argv[1] != "plain" else contextlib.nullcontext():
    tm = fsdp(thunder.jit(m), device=cpu, sharding_strategy=FSDPType.ZERO2)
    tm(torch.randn(3, 8)).sum().backward()
f = walk(thunder.last_traces(tm)[-1], cpu)
backward = thunder.last_backward_traces(tm)[-1]
b = walk(backward, cpu, handed_to_backward(f, cpu))
found = Findings()
shards_returned_uncopied(backward, b, found)
print(json.dumps({"late": f.late + b.late, "peaks": [f.peak, f.prompt_peak], "found": found.failures}))
"""


def _plan(how: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PLAN, how], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_plan_frees_each_tensor_at_its_last_use_and_returns_the_shards_it_reduced() -> None:
    assert _plan("plain") == {"late": [], "peaks": [_plan("plain")["peaks"][0]] * 2, "found": []}


def test_a_gathered_parameter_freed_one_layer_late_is_named() -> None:
    got = _plan("gathered_parameter_freed_one_layer_late")
    # fc1's gathered weight and bias (16 x 8 and 16 float32) kept through fc2's linear, which
    # allocates: the plan peaks higher than it would freeing them first
    assert [late.split(" (")[0].split(" ", 1)[1] for late in got["late"]] == ["float32[16, 8]", "float32[16]"], got
    assert got["peaks"][0] > got["peaks"][1], got
    assert got["found"] == []


def test_a_copied_reduce_scatter_output_is_named_for_each_gradient() -> None:
    got = _plan("reduce_scatter_output_copied")
    assert got["late"] == [] and len(got["found"]) == 1, got
    assert got["found"][0].count("no collective") == 4, got  # fc1's and fc2's weight and bias

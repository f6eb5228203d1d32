"""The data flow of a real FSDP forward trace (conformance/checks/memory/dataflow.py): which storages
it returns, and which of them all-gathers made."""

from __future__ import annotations

import json
import subprocess
import sys

# mlp's layers (8 -> 16 -> 7) sharded over 4 ranks of torch's fake process group: fc2.weight's
# 7 rows are gathered as 8 and sliced back, so its kept view holds the padded 8 x 16 floats
_FORWARD = """
import json, os, torch, torch.distributed as dist, thunder
from torch.testing._internal.distributed.fake_pg import FakeStore
from thunder.distributed import FSDPType, fsdp
from conformance.checks.memory.dataflow import estimated_returned
os.environ["LOCAL_RANK"] = "0"
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 7))
tm = fsdp(thunder.jit(m), device=torch.device("cpu"), sharding_strategy=FSDPType.ZERO2)
tm(torch.randn(3, 8)).sum().backward()
forward, cpu = thunder.last_traces(tm)[-1], torch.device("cpu")
print(json.dumps([estimated_returned(forward, cpu), estimated_returned(forward, cpu, gathered_only=True)]))
"""


def test_a_kept_gathered_parameter_counts_its_padded_storage() -> None:
    out = subprocess.run([sys.executable, "-c", _FORWARD], capture_output=True, text=True, timeout=300, check=True)
    returned, gathered = json.loads(out.stdout.strip().splitlines()[-1])
    # the forward saves relu's output (3 x 16), its mask (3 x 16 bools), returns the output
    # (3 x 7) and keeps gathered fc2.weight, padded, as ZERO2 does by design
    assert gathered == 8 * 16 * 4
    assert returned == gathered + 3 * 16 * 4 + 3 * 16 + 3 * 7 * 4

"""tools/gpu/device_run.sh, the GPU path in one window, rehearsed on this CPU machine (issue
58): every step but CUDA's runs (the suite on gloo, a planted bug that must make its run
fail, the ci step on the smoke profile's cheapest cell to stay short), the CUDA-only probes say they were
skipped, nothing needs the network (no install), and tools/gpu/runs_table.py makes
docs/gpu-runs.md's table of what it left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.matrix.cost import expected_seconds
from conformance.matrix.profiles import cells
from tests.support.suite_runs import ROOT, offered, probed_on_this_machine

sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import runs_table


@pytest.mark.slow
def test_the_gpu_path_rehearses_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    probed = probed_on_this_machine()
    cheapest = min((c for c in cells("smoke", 2, probed) if offered(c, probed)), key=expected_seconds)
    env = {
        **os.environ,
        "OUT": str(out),
        "SKIP_INSTALL": "1",  # the device has no network; here the env is tox's
        "PYTHON": sys.executable,
        "PLANTED": "originals_kept",
        "CI_PROFILE": "smoke",
        "CI_ARGS": f"-k {cheapest.id}",
        "CI_LIMIT": "300",
    }
    run = subprocess.run(
        ["bash", "tools/gpu/device_run.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout + run.stderr
    found = {s.name: s for s in runs_table.steps(out)}
    assert set(found) == {"tp_probe", "shared_gpu", "smoke", "planted_originals_kept", "ci"}, found
    assert found["tp_probe"].rc is None and found["shared_gpu"].rc is None  # CUDA only: skipped, said so
    assert found["smoke"].rc == 0 and found["ci"].rc == 0, (out / "log.txt").read_text()[-3000:]
    assert found["planted_originals_kept"].rc == 1  # the planted bug made its run fail
    table = runs_table.table(out)
    assert "| planted_originals_kept | made the run fail |" in table
    assert "| smoke | " in table and "passed" in table and "skipped: no CUDA" in table
    assert "no CUDA: a rehearsal on gloo" in (out / "env.txt").read_text()


def test_the_table_reads_a_runs_steps(tmp_path: Path) -> None:
    (tmp_path / "steps.txt").write_text(
        "STEP tp_probe rc=0 wall 17s\nSTEP smoke rc=1 wall 25s\nSTEP planted_x rc=0 wall 30s\nSTEP s skipped: no CUDA\n"
    )
    table = runs_table.table(tmp_path)
    assert "| smoke | no report (exit 1) | 25 s |" in table
    assert "| planted_x | **did not make the run fail** (exit 0) | 30 s |" in table
    assert "| s | skipped: no CUDA | - |" in table
    assert runs_table.main([str(tmp_path / "nowhere")]) == 2

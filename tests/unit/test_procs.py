"""How a rank ended, when torchrun reaped it before the watcher looked (conformance/world/procs.py):
torchrun's own log, read for the rank's pid, gives the same account /proc would have."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conformance.world import procs

# rank 1 kills itself once rank 0 has said its pid (on a loaded host rank 0 may still be
# starting when rank 1 dies, and torchrun would end it before it wrote one); rank 0 waits
# until torchrun ends it (SIGTERM when it closes the world)
PROGRAM = """
import os, signal, sys, time
folder = sys.argv[1]
with open(f"{folder}/rank{os.environ['RANK']}.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(f"{folder}/rank{os.environ['RANK']}.tmp", f"{folder}/rank{os.environ['RANK']}.pid")
if os.environ["RANK"] == "1":
    deadline = time.monotonic() + 60
    while not os.path.exists(f"{folder}/rank0.pid") and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def test_torchruns_log_tells_how_a_reaped_rank_ended(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(PROGRAM)
    log = tmp_path / "torchrun.log"
    with log.open("wb") as out:
        launched = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--monitor-interval=0.2",
             "--standalone", str(tmp_path / "program.py"), str(tmp_path)],
            stdout=out, stderr=subprocess.STDOUT, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    assert launched.returncode != 0, log.read_text()
    killed, closed = (int((tmp_path / f"rank{r}.pid").read_text()) for r in (1, 0))
    assert procs.process_state(killed) == (False, None)  # torchrun reaped it: /proc says nothing
    assert procs.describe_exit(procs.reaped_status(log, killed)) == "the rank process was killed by signal SIGKILL"
    assert procs.reaped_status(log, closed) == signal.SIGTERM  # torchrun closed the other
    assert procs.reaped_status(log, 1, wait_s=0.2) is None  # a pid torchrun never named: no account


def test_an_exit_code_in_torchruns_log_is_a_wait_status(tmp_path: Path) -> None:
    log = tmp_path / "torchrun.log"
    log.write_text("E1129 api.py:986] failed (exitcode: 3) local_rank: 0 (pid: 77) of binary: python\n")
    assert procs.describe_exit(procs.reaped_status(log, 77, wait_s=0)) == "the rank process exited with code 3"

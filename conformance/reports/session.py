"""What the front end tells the reports about a run: plain values, fixed once options are read."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from conformance.reports.outcomes import plain_nodeid


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    backend: str
    nproc: int
    profile: str
    isolate: bool
    xfails_file: Path
    default_xfails: bool  # whether xfails_file is the kit's own (a repro need not name it)
    # what was asked for and what the pytest process found of CUDA: the report says when the
    # run did not exercise the GPUs it could see (reports/environment.py: warnings)
    requested_backend: str = "auto"
    gpus_visible: int = 0  # torch.cuda.device_count(), through CUDA_VISIBLE_DEVICES
    cuda_unusable: str | None = None  # why this torch cannot use them, where it cannot
    xdist_workers: int = 1  # the visible GPUs are split between them
    # across machines: nproc ranks are laid out as nnodes machines of nproc // nnodes ranks each
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    # --thunder-coverage: the folder the ranks save their coverage data into (None: off)
    thunder_coverage: Path | None = None
    cells: tuple[str, ...] | None = None  # --cells: the cells asked for, in order (None: the profile's)
    chaos: tuple[int, float] | None = None  # --chaos SEED and --chaos-share (None: off)

    def repro(self, nodeid: str) -> str:
        """The command line that reruns one item as this run ran it."""
        args = ["python", "-m", "pytest", plain_nodeid(nodeid), "--nproc", str(self.nproc), "--backend", self.backend]
        if self.nnodes > 1:  # with a join agent on each other machine, as this run had
            args[5] = str(self.nproc // self.nnodes)  # --nproc counts ranks per machine there
            args += ["--nnodes", str(self.nnodes), "--rdzv-endpoint", str(self.rdzv_endpoint)]
        if self.profile != "ci":  # the item exists only where its profile picks its cell
            args += ["--profile", self.profile]
        if not self.default_xfails:
            args += ["--xfails", str(self.xfails_file)]
        if self.chaos is not None:  # the plan is the seed's: the same fault in the same cell
            args += ["--chaos", str(self.chaos[0]), "--chaos-share", str(self.chaos[1])]
        return shlex.join(args)

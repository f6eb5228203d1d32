"""Spawning a world: the torchrun command line, its environment, and which devices it gets.

Kept apart from the controller so that what is launched can be read (and printed as a
repro) without reading how it is supervised.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from conformance.world import protocol

ROOT = Path(__file__).resolve().parents[2]  # the repository: ranks import the kit from here


def visible_cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(requested: str, nproc: int) -> str:
    """``auto`` is nccl when every rank can have a GPU of its own, gloo otherwise."""
    if requested != "auto":
        return requested
    return "nccl" if visible_cuda_devices() >= nproc else "gloo"


def device_slice(backend: str, nproc: int, slot: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES of the world in ``slot`` (an xdist worker's index), or None.

    NCCL refuses two ranks on one GPU, so concurrent worlds must not overlap.
    """
    if backend != "nccl":
        return None
    first = slot * nproc
    if first + nproc > visible_cuda_devices():
        raise RuntimeError(
            f"world slot {slot} needs GPUs {first}..{first + nproc - 1} but only "
            f"{visible_cuda_devices()} are visible: run fewer xdist workers or a smaller --nproc"
        )
    return ",".join(str(i) for i in range(first, first + nproc))


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    nproc: int
    backend: str
    cuda_devices: str | None = None
    # torchrun reacts to a dead rank by killing the others; the controller wants to take
    # their stacks first, so torchrun looks less often than the controller does.
    monitor_interval: float = 2.0

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",  # a free rendezvous port per world: worlds never collide
            f"--nproc-per-node={self.nproc}",
            "--max-restarts=0",
            f"--monitor-interval={self.monitor_interval}",
            "-m",
            "conformance.world.rankloop",
        ]

    def environment(self, control: str, world_dir: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                protocol.ENV_CONTROL: control,
                protocol.ENV_WORLD_DIR: str(world_dir),
                protocol.ENV_CONTROLLER_PID: str(os.getpid()),
                protocol.ENV_BACKEND: self.backend,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
                "PYTHONUNBUFFERED": "1",
                # torchrun prints a banner about this when it sets it itself
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            }
        )
        if self.cuda_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_devices
        return env

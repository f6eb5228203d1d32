"""Spawning a world: the torchrun command line, its environment, and which devices it gets.

Kept apart from the controller so that what is launched can be read (and printed as a
repro) without reading how it is supervised.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from conformance.world import protocol, seal
from conformance.world.zygote import ENV_ZYGOTE

ROOT = Path(__file__).resolve().parents[2]  # the repository: ranks import the kit from here
MASK = "CUDA_VISIBLE_DEVICES"
# The mask of a process that must not touch a GPU: a CPU world's ranks and the zygote that
# forks them. A process that counted the GPUs (Thunder's import asks torch.cuda.is_available)
# has initialized the driver, and a child forked from it fails its first CUDA call with
# "initialization error"; Thunder makes one in every CPU forward (is_cudagraph_capturing).
HIDDEN = ""


@dataclasses.dataclass(frozen=True)
class Cuda:
    """What this process finds of CUDA: the devices the driver shows it, and whether this
    torch can use them (a CPU build, or a driver older than the build's CUDA, cannot)."""

    devices: int = 0  # torch.cuda.device_count(): NVML's count, through CUDA_VISIBLE_DEVICES
    unusable: str | None = None  # why this torch cannot use them, where it cannot

    @property
    def usable(self) -> int:
        return 0 if self.unusable else self.devices


def inspect_cuda(cuda: Any) -> Cuda:
    """``cuda`` is ``torch.cuda`` (tests hand in a stand-in). device_count() counts through
    NVML, so it sees devices that the CUDA runtime of this build may fail to initialize: only
    ``init()`` tells, and its driver error must end up in the report, not end the run."""
    with warnings.catch_warnings(record=True) as said:  # torch explains a failed init in a warning
        warnings.simplefilter("always")
        devices = int(cuda.device_count())  # never raises: 0 where no driver answers
        if devices == 0:
            return Cuda()
        if not cuda.is_available():
            why = _first_line(said[-1].message) if said else "no reason given"
            return Cuda(devices, f"torch.cuda.is_available() is False: {why}")
        try:
            cuda.init()
        except Exception as exc:  # a driver or runtime error (RuntimeError), a CPU build (AssertionError)
            return Cuda(devices, f"torch.cuda.init() raised {type(exc).__name__}: {_first_line(exc)}")
    return Cuda(devices)


def _first_line(what: object) -> str:
    """A message's first line, without its full stop: it goes inside a sentence."""
    lines = str(what).strip().splitlines()
    return lines[0].rstrip(".") if lines else ""


@functools.cache
def cuda() -> Cuda:
    """Asked once per process: torch caches its own answers after init anyway."""
    try:
        import torch
    except ImportError:
        return Cuda()
    return inspect_cuda(torch.cuda)


def visible_cuda_devices() -> int:
    """The GPUs the ranks can use: none where this torch cannot use what is visible."""
    return cuda().usable


def visible_device_ids() -> list[str]:
    """The devices as the parent's CUDA_VISIBLE_DEVICES names them (indices or ``GPU-…``/
    ``MIG-…`` UUIDs, in its order), else ``0 .. n-1``. A rank's CUDA_VISIBLE_DEVICES replaces
    the parent's, so a slice must name the parent's entries, never positions within them.
    CUDA stops at the first entry that names no device, so only the first ``n`` count."""
    count = visible_cuda_devices()
    mask = os.environ.get(MASK)
    if mask is None:
        return [str(i) for i in range(count)]
    return [entry.strip() for entry in mask.split(",") if entry.strip()][:count]


def gpus_per_worker(workers: int = 1) -> int:
    """Each of ``workers`` xdist workers owns an equal, disjoint block of the visible GPUs (a
    remainder is left idle): worlds of different workers never share a device."""
    return visible_cuda_devices() // max(workers, 1)


def resolve_backend(requested: str, nproc: int, workers: int = 1) -> str:
    """``auto`` is nccl when every rank can have a GPU of its own, gloo otherwise."""
    if requested != "auto":
        return requested
    return "nccl" if gpus_per_worker(workers) >= nproc else "gloo"


def device_slice(backend: str, nproc: int, slot: int, workers: int = 1) -> str | None:
    """The CUDA_VISIBLE_DEVICES of a world of ``nproc`` ranks of xdist worker ``slot`` of
    ``workers``, or None: the first ``nproc`` devices of that worker's block.

    NCCL refuses two ranks on one GPU, and concurrent workers must not share one. Any other
    backend's ranks run on the CPU and see no GPU (``HIDDEN``).
    """
    if backend != "nccl":
        return HIDDEN
    per = gpus_per_worker(workers)
    block = visible_device_ids()[slot * per : (slot + 1) * per]
    if nproc > len(block):
        raise RuntimeError(
            f"a world of {nproc} ranks in xdist worker {slot} of {workers} needs {nproc} GPUs, its share of the "
            f"{visible_cuda_devices()} visible is {block}: run fewer xdist workers or a smaller --nproc"
        )
    return ",".join(block[:nproc])


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """Where the torchruns of a world across machines meet: torchrun's c10d rendezvous, kept
    in the controller's agent store, so that a world needs no port of its own on any node."""

    nnodes: int
    endpoint: str  # HOST:PORT of the controller's agent store
    rdzv_id: str  # fresh for every world start: a rendezvous is never reused
    node: int = 0  # the node whose part of the world this torchrun starts

    def arguments(self) -> list[str]:
        return [
            f"--nnodes={self.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.rdzv_id}",
            # the controller hosts the store; a torchrun that guessed otherwise from the host name would try to bind it
            "--rdzv-conf=is_host=false",
        ]


def rank_environment() -> dict[str, str]:
    """What every rank's environment holds before its world's own variables: this process's,
    with the kit importable. A zygote is started with it too."""
    env = dict(os.environ)
    # a token or node inherited from the shell must not make a one-machine world seal
    env.pop(seal.ENV_TOKEN, None)
    env.pop(protocol.ENV_NODE, None)
    env.pop(protocol.ENV_AGENT, None)
    env.pop(ENV_ZYGOTE, None)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
            # torchrun prints a banner about this when it sets it itself
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        }
    )
    return env


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    nproc: int  # ranks on each node: the world has nproc * nnodes
    backend: str
    cuda_devices: str | None = None
    # torchrun reacts to a dead rank by killing the others; the controller wants to take
    # their stacks first, so torchrun looks less often than the controller does.
    monitor_interval: float = 2.0
    rendezvous: Rendezvous | None = None  # None: one machine, a standalone torchrun
    zygote: str | None = None  # the socket of a zygote that forks the ranks (zygote.py), or None: fresh ranks

    def command(self) -> list[str]:
        # --standalone: a free rendezvous port per world, so that worlds never collide
        where = ["--standalone"] if self.rendezvous is None else self.rendezvous.arguments()
        if self.zygote is None:
            torchrun, rank = [sys.executable, "-m", "torch.distributed.run"], ["-m", "conformance.world.rankloop"]
        else:  # each forked from the zygote: a stub (forked.py) stands in for it
            torchrun = [sys.executable, "-m", "conformance.world.forked", "torch.distributed.run"]
            rank = ["-m", "conformance.world.forked", "conformance.world.rankloop"]
        return [
            *torchrun,
            *where,
            f"--nproc-per-node={self.nproc}",
            "--max-restarts=0",
            f"--monitor-interval={self.monitor_interval}",
            *rank,
        ]

    def environment(self, control: str, world_dir: Path, token: str | None = None) -> dict[str, str]:
        """``token``: the run's, where the control traffic is sealed (across machines)."""
        env = rank_environment()
        env.update(
            {
                protocol.ENV_CONTROL: control,
                protocol.ENV_WORLD_DIR: str(world_dir),
                protocol.ENV_BACKEND: self.backend,
            }
        )
        if self.zygote is not None:
            env[ENV_ZYGOTE] = self.zygote
        if self.cuda_devices is not None:
            env[MASK] = self.cuda_devices
        if self.rendezvous is not None:
            env[protocol.ENV_NODE] = str(self.rendezvous.node)
        if token is not None:
            env[seal.ENV_TOKEN] = token
        return env

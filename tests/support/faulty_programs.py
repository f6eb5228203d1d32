"""Rank programs that misbehave on purpose, for the runner's own tests.

Each runs on every rank of a world; the ``rank`` argument picks the one that misbehaves
while the others do what healthy ranks do: wait in a collective for it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

import torch
import torch.distributed as dist


def _all_reduce() -> float:
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def healthy() -> dict[str, float | int]:
    return {"rank": dist.get_rank(), "sum": _all_reduce(), "pid": os.getpid()}


def raise_on(rank: int) -> float:
    if dist.get_rank() == rank:
        raise ValueError(f"planted failure on rank {rank}")
    return _all_reduce()


def hang_on(rank: int) -> float:
    if dist.get_rank() == rank:
        while True:
            time.sleep(0.1)
    return 0.0


def sigstop_on(rank: int) -> float:
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGSTOP)
    return _all_reduce()


def sigstop_then_peer_dies(rank: int) -> float:
    """``rank`` stops itself; a peer waiting on it dies a second later, before the controller
    gives the stop up (as a collective watchdog aborts a process whose peer never joined)."""
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGABRT)
    return _all_reduce()


def sigkill_on(rank: int) -> float:
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    return _all_reduce()


def exit_on(rank: int, code: int) -> float:
    if dist.get_rank() == rank:
        os._exit(code)
    return _all_reduce()


def segfault_on(rank: int) -> float:
    if dist.get_rank() == rank:
        ctypes.string_at(0)
    return _all_reduce()


def unserializable() -> object:
    return object()


def hang_in_collective(rank: int) -> float:
    """``rank`` hangs; every other rank waits for it inside an all-reduce."""
    if dist.get_rank() == rank:
        while True:
            time.sleep(0.1)
    return _all_reduce()

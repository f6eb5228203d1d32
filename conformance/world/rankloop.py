"""The rank loop: what every process of a world runs (``python -m conformance.world.rankloop``).

torchrun starts this module once per rank. It joins the process group, greets the controller
over the control store, then runs tasks in the order the controller numbers them until it is
told to stop or the controller disappears. A task that raises is reported, not
fatal: the controller decides whether the world is still fit for the next one.

(Not called "worker": pytest-xdist's workers are pytest processes, each the controller of a
world of its own.)
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import importlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from conformance.world import protocol

# ``store.wait`` with a timeout logs a warning each time it expires, so the loop polls with
# ``check`` instead: a short sleep keeps the latency well below a cell's cost.
POLL_S = 0.005
CONTROLLER_CHECK_S = 2.0


def resolve(fn: str) -> Callable[..., Any]:
    module_name, _, attr = fn.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _redirect_output(world_dir: str, rank: int) -> None:
    # One log per rank, so a failure can quote the rank that failed and nothing else.
    log = os.open(os.path.join(world_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _controller_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(task: protocol.Task, rank: int) -> protocol.RankResult:
    start = time.perf_counter()
    # What the process holds as a task begins (torch, Thunder, what earlier tasks left in
    # caches: hundreds of thousands of objects) is frozen out of the collector: a task's own
    # full collections (a cell takes several to find cycles that hold tensors) then walk only
    # what the task made, instead of all of them each time, and its census of live tensors
    # sees only what the task allocated.
    gc.collect()
    gc.freeze()
    try:
        value = resolve(task.fn)(**task.kwargs)
        json.dumps(value)  # a result the controller cannot read is a failure of this rank
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return protocol.RankResult(
            rank=rank,
            status=protocol.FAILED,
            error="".join(traceback.format_exception(exc)),
            frames=protocol.frames_of(exc),
            duration=time.perf_counter() - start,
        )
    return protocol.RankResult(rank=rank, status=protocol.PASSED, value=value, duration=time.perf_counter() - start)


def _wait_for(store: Any, key: str, controller_pid: int) -> bool:
    """Wait for ``key``; False once the controller has gone (a rank must never outlive it)."""
    last_check = time.monotonic()
    while True:
        try:
            if store.check([key]):
                return True
        except Exception:
            return False
        time.sleep(POLL_S)
        if time.monotonic() - last_check > CONTROLLER_CHECK_S:
            if not _controller_alive(controller_pid):
                return False
            last_check = time.monotonic()


def main() -> int:
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world_dir = os.environ[protocol.ENV_WORLD_DIR]
    controller_pid = int(os.environ[protocol.ENV_CONTROLLER_PID])
    host, _, port = os.environ[protocol.ENV_CONTROL].rpartition(":")

    _redirect_output(world_dir, rank)
    faulthandler.enable()  # segfaults and aborts print the Python stack into the rank log
    stacks = open(os.path.join(world_dir, f"rank{rank}.stacks"), "a")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)

    store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=60))
    backend = os.environ[protocol.ENV_BACKEND]
    if backend == "nccl":
        import torch

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if backend != protocol.NO_GROUP:
        dist.init_process_group(backend)
    store.set(protocol.hello_key(rank), json.dumps({"pid": os.getpid()}))

    seq = 0
    while True:
        key = protocol.task_key(seq)
        if not _wait_for(store, key, controller_pid):
            return 1
        task = protocol.Task.decode(store.get(key))
        if task.fn == protocol.SHUTDOWN:
            break
        store.set(protocol.result_key(seq, rank), _run(task, rank).encode())
        seq += 1
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

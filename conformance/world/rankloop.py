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
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from conformance.world import protocol, seal

# A rank blocks in ``store.wait``: idle, it costs no CPU at all. c10d logs a warning each time
# such a wait expires, so the wait is long and simply renewed while the world stays idle.
IDLE_WAIT = datetime.timedelta(hours=1)
# The watch's key is never set: its wait ends only when the controller's store goes away.
NEVER = "never"
ORPHANED = 3  # exit status of a rank whose controller is gone


def resolve(fn: str) -> Callable[..., Any]:
    module_name, _, attr = fn.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _warm_cublas(device: Any) -> None:
    """cuBLAS and cuBLASLt take their workspaces from the caching allocator at a handle's first
    call and keep them for the process, one handle per thread: on an H200, 32 MiB that a
    matmul here took away from the first cell, and 1 MiB more that it did not (cuBLASLt's,
    taken by a linear with a bias, we believe: not yet run on a GPU, docs/gpu-runs.md). Left
    to the first cell, they are counted as memory its Thunder held, so both kinds of call run
    here, in this thread and in autograd's, which runs every backward."""
    import torch

    def gemms() -> None:
        w = torch.ones(16, 16, device=device)
        b = torch.ones(16, device=device)
        for dtype in (torch.float32, torch.bfloat16):
            w_, b_ = w.to(dtype), b.to(dtype)
            torch.nn.functional.linear(w_ @ w_, w_, b_)

    class InBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            gemms()
            return grad

    gemms()
    InBackward.apply(torch.ones(1, device=device, requires_grad=True)).sum().backward()
    torch.cuda.synchronize(device)


def _redirect_output(world_dir: str, rank: int) -> None:
    # One log per rank, so a failure can quote the rank that failed and nothing else.
    log = os.open(os.path.join(world_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


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
            exception=protocol.exception_of(exc),
            duration=time.perf_counter() - start,
        )
    return protocol.RankResult(rank=rank, status=protocol.PASSED, value=value, duration=time.perf_counter() - start)


def wait_for(store: Any, key: str) -> bool:
    """Block until ``key`` is set; False once the controller's store has gone."""
    import torch.distributed as dist

    while True:
        try:
            store.wait([key], IDLE_WAIT)
            return True
        except dist.DistStoreError:  # the wait expired: still idle, still wanted
            continue
        except Exception:  # the connection closed: the controller is gone
            return False


def _watch_controller(host: str, port: int) -> None:
    """Exit the process the moment the controller's store goes away, whatever the rank is
    doing: a rank must never outlive its controller, and one blocked in a collective whose
    peer was killed with it would otherwise wait out gloo's timeout. Its own connection,
    so that it blocks beside the main thread's."""
    import torch.distributed as dist

    store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=60))
    while wait_for(store, NEVER):
        pass
    os.write(2, b"\nthe controller's control store is gone: this rank exits\n")
    os._exit(ORPHANED)


def main() -> int:
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world_dir = os.environ[protocol.ENV_WORLD_DIR]
    host, _, port = os.environ[protocol.ENV_CONTROL].rpartition(":")

    _redirect_output(world_dir, rank)
    os.environ[protocol.ENV_PHASE] = protocol.phase_file(world_dir, rank)
    faulthandler.enable()  # segfaults and aborts print the Python stack into the rank log
    stacks = open(os.path.join(world_dir, f"rank{rank}.stacks"), "a")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)

    store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=60))
    # sealed with the run's token across machines, plain on one (the launcher sets it or not)
    channel = seal.Channel(store, seal.Seal(os.environ.get(seal.ENV_TOKEN)))
    threading.Thread(target=_watch_controller, args=(host, int(port)), name="controller-watch", daemon=True).start()
    backend = os.environ[protocol.ENV_BACKEND]
    if backend == "nccl":
        import torch

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        _warm_cublas(torch.device("cuda", torch.cuda.current_device()))
    if backend != protocol.NO_GROUP:
        dist.init_process_group(backend)
    hello: dict[str, Any] = {"pid": os.getpid()}
    if protocol.ENV_NODE in os.environ:  # across machines: whose agent watches this rank
        hello.update(node=int(os.environ[protocol.ENV_NODE]), log=os.path.join(world_dir, f"rank{rank}.log"))
    channel.set(protocol.hello_key(rank), json.dumps(hello))

    seq = 0
    while True:
        key = protocol.task_key(seq)
        if not wait_for(store, key):
            return 1
        task = protocol.Task.decode(channel.get(key))
        if task.fn == protocol.SHUTDOWN:
            break
        with open(protocol.phase_file(world_dir, rank), "w"):  # the last task's phase is not this one's
            pass
        if int(os.environ.get(protocol.ENV_NODE, "0")) > 0:  # nor its copy in the control store
            channel.set(protocol.phase_key(rank), "")
        channel.set(protocol.result_key(seq, rank), _run(task, rank).encode())
        seq += 1
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

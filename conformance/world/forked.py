"""``python -m conformance.world.forked MODULE [ARG ...]``: run ``python -m MODULE ARG ...``
as a process forked from the run's zygote (conformance/world/zygote.py), standing in for it
towards whoever started this one (the controller for torchrun, torchrun for a rank): the
signals it receives are passed on, and it exits as the forked process exited.

It imports nothing heavy: its whole cost is a Python start. Where the zygote cannot be
reached, or fails before answering, it becomes ``python -m MODULE ARG ...`` itself
(``exec``), so a broken zygote costs time, never a cell.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from pathlib import Path

from conformance.world.protocol import ENV_WORLD_DIR
from conformance.world.zygote import _HEADER, ENV_ZYGOTE

# what torchrun sends to stop its workers, and what the controller may send to a rank's stub
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _fresh(argv: list[str], why: str) -> None:
    os.write(2, f"the zygote could not fork {argv[0]} ({why}): starting it afresh\n".encode())
    os.execv(sys.executable, [sys.executable, "-m", *argv])


def _lines(conn: socket.socket):
    buffered = b""
    while True:
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield json.loads(line)
        more = conn.recv(4096)
        if not more:
            return
        buffered += more


def main(argv: list[str]) -> int:
    # the write end stays open, never written, as long as this process lives: the forked
    # process reads end-of-file on watch_r once it is gone
    watch_r, _ = os.pipe()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(os.environ[ENV_ZYGOTE])
        request = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "argv": argv}).encode()
        socket.send_fds(conn, [_HEADER.pack(len(request)) + request], [0, 1, 2, watch_r])
        answers = _lines(conn)
        pid = next(answers)["pid"]
    except (OSError, KeyError, StopIteration, ValueError) as exc:
        _fresh(argv, f"{type(exc).__name__}: {exc}")
    os.close(watch_r)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(pid, signum))
    status = next(answers, None)
    if status is None:  # the zygote died with the child still running: end the child too
        _forward(pid, signal.SIGKILL)
        return 1
    _leave_status(status["status"])
    code = os.waitstatus_to_exitcode(status["status"])
    if code < 0:  # the rank died of a signal: so does this process, as torchrun expects of a worker
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _leave_status(status: int) -> None:
    """The forked rank's wait status, left in its world's folder: the zygote reaped it at once,
    so a watcher that looks in /proc after that finds nothing (procs.forked_status reads it)."""
    folder, rank = os.environ.get(ENV_WORLD_DIR), os.environ.get("RANK")
    if folder and rank:
        with contextlib.suppress(OSError):
            Path(folder, f"rank{rank}.status").write_text(str(status))


def _forward(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Warm rank starts: a zygote process imports what every rank imports (torch, Thunder, the
kit's rank side) once, then forks a rank for each one torchrun starts.

Importing torch and Thunder costs a rank about six CPU seconds, the same in every rank of
every world; forked from the zygote, a rank costs milliseconds (torchrun, which imports
torch too, is forked the same way). torchrun still launches, watches and stops every rank:
what it starts is a stub (``conformance.world.forked``) that hands the zygote its command,
environment and standard streams, and lives as long as the forked process, passing the
signals it receives on to it and returning its exit status.

The zygote is single-threaded (forking a process with other threads may copy a lock one of
them held), forks before anything creates a thread, a process group or a CUDA context, and
gives each child the stub's environment, so that a forked rank sees what a fresh one sees;
only what modules read from the environment while they are imported is the zygote's
(the same run's environment, less torchrun's per-rank variables).

Wire format over the zygote's Unix socket: the stub sends a 4-byte length, then its request
as JSON, with four descriptors attached (stdin, stdout, stderr, and the read end of a pipe
whose write end only the stub holds: the child exits when it reads end-of-file, so a stub
killed outright never leaves its rank behind). The zygote answers ``{"pid": N}`` and a line,
and, when the child has exited, ``{"status": S}`` (a wait status) and a line.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

ENV_ZYGOTE = "CONFORMANCE_ZYGOTE"  # the socket a stub asks for its rank
ORPHANED = 3  # exit status of a forked process whose stub is gone (as a rank's whose controller is)
_HEADER = struct.Struct("!I")


class Zygote:
    """The controller's handle on one zygote, started on first use and shared by every world
    of the run that starts its ranks from it."""

    def __init__(self, preload: list[str], env: dict[str, str], cwd: Path) -> None:
        self.preload = preload  # modules every rank imports
        self.env = env
        self.cwd = cwd
        self._dir: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def path(self) -> str:
        """The zygote's socket; starts the zygote where none runs."""
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._dir = tempfile.mkdtemp(prefix="conformance-zygote-")  # 0700: only this user connects
            with open(os.path.join(self._dir, "zygote.log"), "wb") as log:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", __name__, self._socket(), *self.preload],
                    env=self.env,
                    cwd=self.cwd,
                    stdin=subprocess.PIPE,  # closed by close(), or by this process's death: the zygote then exits
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a world's kill (its torchrun's process group) leaves it be
                )
        return self._socket()

    def _socket(self) -> str:
        assert self._dir is not None
        return os.path.join(self._dir, "socket")

    def close(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()  # type: ignore[union-attr]
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


# -- the zygote process --------------------------------------------------------------------


def serve(path: str, preload: list[str]) -> None:
    """Listen first (a stub that connects while the imports run waits in the backlog), import,
    then fork a child per request until the controller closes standard input."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(256)
    for name in preload:
        # a module that does not import (a broken Thunder) is left to the ranks, which import
        # it again and report the error in the cell it belongs to
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    gc.collect()
    gc.freeze()  # what every child inherits stays out of its collections, and unwritten: shared pages
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd hears of exits
    children: dict[int, socket.socket] = {}  # child pid -> its stub's connection
    stdin = sys.stdin.fileno()
    while True:
        _reap(children)
        try:
            ready, _, _ = select.select([listener, stdin, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
        if stdin in ready and not os.read(stdin, 4096):
            return  # the controller is gone: its ranks follow it on their own (rankloop's watch)
        if listener in ready:
            conn, _ = listener.accept()
            try:
                request, fds = _receive(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                _child(request, fds, [listener, conn, *children.values()], [wake_r, wake_w])
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 4)
    if len(fds) != 4 or len(data) < _HEADER.size:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request without its four descriptors")
    (size,) = _HEADER.unpack_from(data)
    data = data[_HEADER.size :]
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise ValueError("a request cut short")
        data += more
    return json.loads(data), fds


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
            conn.close()


def _child(request: dict, fds: list[int], sockets: list[socket.socket], pipes: list[int]) -> None:
    """Become the stub's command (``python -m MODULE ARG ...``), with its streams, directory
    and environment, in a session of its own as a fresh process would be. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in sockets:  # the zygote's: a child holding them would keep stubs waiting
            sock.close()
        for fd in pipes:
            os.close(fd)
        *streams, watch = fds
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
            os.close(fd)
        os.setsid()  # out of the zygote's process group: a signal meant for it never reaches this
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        module, *args = request["argv"]
        sys.argv = [module, *args]
        threading.Thread(target=_watch_stub, args=(watch,), name="stub-watch", daemon=True).start()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _watch_stub(fd: int) -> None:
    """Exit when the stub is gone (the pipe's only write end closed): killed outright, it
    could not pass the signal on."""
    while os.read(fd, 1):
        pass
    os.write(2, b"\nthe stub that stood in for this process is gone: it exits\n")
    os._exit(ORPHANED)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])

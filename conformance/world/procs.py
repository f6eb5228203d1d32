"""Processes seen from outside: whether one lives, how it ended, and the end of its log.

Shared by the controller, which watches the ranks on its own machine, and by a join agent,
which watches the ranks on its node for a controller that cannot read that node's /proc.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

# A watcher looks in turn at results, deaths and deadlines; the pause between looks doubles
# from 1 ms up to 50 ms, so a short task is answered at once and a long one costs twenty
# looks a second. (Blocking in c10d's ``wait`` would need a timeout to notice deaths, and
# c10d logs a warning at each expiry.)
FIRST_PAUSE_S = 0.001
LONGEST_PAUSE_S = 0.05
LOG_TAIL_CHARS = 4000
STACK_WAIT_S = 2.0
# torchrun reaps a dead rank within its monitor interval (launch.py: 2 s), and on a loaded
# machine before a watcher looks: its own log then says how the rank ended, once it has closed
# the others. Its two forms: "failed (exitcode: -9) local_rank: 1 (pid: 4242) of binary: ..."
# and ChildFailedError's table, "exitcode  : -9 (pid: 4242)" (negative: the signal's number).
TORCHRUN_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)\)?\s*(?:local_rank:\s*\d+\s*)?\(pid:\s*(\d+)\)")
TORCHRUN_ACCOUNT_WAIT_S = 5.0


def pauses() -> Iterator[float]:
    pause = FIRST_PAUSE_S
    while True:
        yield pause
        pause = min(2 * pause, LONGEST_PAUSE_S)


def process_state(pid: int) -> tuple[bool, int | None]:
    """(alive, wait status) of a process that is not our child: /proc shows zombies' status."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return False, None
    except OSError:  # no /proc (macOS): a zombie counts as alive until torchrun reaps it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False, None
        return True, None
    if fields[0] in ("Z", "X"):
        return False, int(fields[49]) if len(fields) > 49 else None
    return True, None


def launched_ranks(variable: str, value: str) -> dict[int, int]:
    """rank -> pid of the processes started with ``variable=value`` and a ``RANK`` in their
    environment (a world's ranks, by its folder, before they greet: torchrun starts each with
    both; behind a zygote, the stub that lives and dies with its forked rank). Empty without
    /proc (macOS)."""
    found: dict[int, int] = {}
    wanted = f"{variable}={value}".encode()
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        rank = next((v[5:] for v in env if v.startswith(b"RANK=")), None)
        if wanted in env and rank is not None and rank.isdigit():
            found.setdefault(int(rank), int(entry.name))
    return found


class Stops:
    """Since when each watched process has been stopped by a signal (SIGSTOP; a debugger's
    stop is left alone: someone may be stepping through it)."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}

    def look(self, pids: dict[int, int], now: float) -> dict[int, float]:
        """For each key of ``pids`` whose process is stopped, how long it has been."""
        for key, pid in pids.items():
            if stopped(pid, traced=False):
                self._since.setdefault(key, now)
            else:
                self._since.pop(key, None)
        return {k: now - t for k, t in self._since.items() if k in pids}


class StartWatch:
    """A world's ranks on this machine while it starts, before they greet: which went first.
    torchrun starts them together and, within its monitor interval of the first loss, kills
    the rest, so the first seen gone is why the world did not start; one never seen while
    another lived went before it."""

    def __init__(self, variable: str, world_dir: str, nproc: int) -> None:
        self.variable, self.world_dir, self.nproc = variable, world_dir, nproc
        self.launched: dict[int, int] = {}  # rank -> pid
        self.died: list[int] = []

    def look(self) -> None:
        if self.died:  # decided: torchrun's own kills that follow say nothing more
            return
        if len(self.launched) < self.nproc:
            self.launched.update(launched_ranks(self.variable, self.world_dir))
        if gone := [r for r, pid in self.launched.items() if not process_state(pid)[0]]:
            self.died = [r for r in range(self.nproc) if r not in self.launched] or gone


def stopped(pid: int, *, traced: bool = True) -> bool:
    """Whether the process is stopped (SIGSTOP; ``traced``: a debugger's stop too): alive, and
    not going to answer until someone continues it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in (("T", "t") if traced else ("T",))
    except (OSError, IndexError):  # gone, or no /proc (macOS): not known to be stopped
        return False


def reaped_status(torchrun_log: Path, pid: int, wait_s: float = TORCHRUN_ACCOUNT_WAIT_S) -> int | None:
    """The wait status of ``pid``, which torchrun reaped before anyone else saw it, as
    torchrun's log tells it (waiting up to ``wait_s`` for the line); None where it never does."""
    deadline = time.monotonic() + wait_s
    while True:
        for code, logged in TORCHRUN_EXIT.findall(tail(torchrun_log, 4 * LOG_TAIL_CHARS)):
            if int(logged) == pid:
                code = int(code)
                return -code & 0x7F if code < 0 else (code & 0xFF) << 8
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def forked_status(world_dir: Path, rank: int, wait_s: float = 1.0) -> int | None:
    """The wait status of a rank forked by the zygote, which reaps it at once: its stub leaves
    it in the world's folder as soon as the zygote tells it (forked.py), within milliseconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return int((world_dir / f"rank{rank}.status").read_text())
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return None
        time.sleep(0.01)


def describe_exit(status: int | None) -> str:
    if status is None:
        return "the rank process exited (its exit status was already reaped)"
    if status & 0x7F:
        sig = status & 0x7F
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"the rank process was killed by signal {name}"
    return f"the rank process exited with code {(status >> 8) & 0xFF}"


def tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ""
    return data[-chars:].decode(errors="replace")


def collect_stacks(world_dir: Path, pids: dict[int, int]) -> dict[int, str]:
    """Each rank's Python stacks (rank -> pid): faulthandler writes them to ``rank<N>.stacks``
    on SIGUSR1 (conformance/world/rankloop.py); what it added since is read back."""
    files = {r: world_dir / f"rank{r}.stacks" for r in pids}
    sizes = {r: f.stat().st_size if f.exists() else 0 for r, f in files.items()}
    signalled = []
    for r, pid in pids.items():
        try:
            os.kill(pid, signal.SIGUSR1)
            signalled.append(r)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline and not all(
        files[r].exists() and files[r].stat().st_size > sizes[r] for r in signalled
    ):
        time.sleep(0.02)
    time.sleep(0.05)  # let faulthandler finish writing every thread
    return {r: files[r].read_bytes()[sizes[r] :].decode(errors="replace") for r in signalled if files[r].exists()}

"""The controller side: one long-lived world of ranks, and tasks run on it under a deadline.

The pytest process is the controller. It owns the control store, starts torchrun, hands
every rank the same task and gathers one result per rank. It is the only party that can
be trusted to notice a hang or a death, so every way a rank can stop answering ends here
in a verdict with evidence (the rank's traceback, its stack, its log) and a fresh world.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from conformance.world import procs, protocol
from conformance.world.launch import ROOT, LaunchSpec
from conformance.world.nodes import NodeError, Nodes
from conformance.world.outcome import Outcome
from conformance.world.protocol import BEAT_S
from conformance.world.seal import PLAIN, Channel, WrongToken, control_store

START = "world start"  # the phase of a rank lost before it greeted

# how long a world retired at the end of a run may take to exit before it is killed
CLOSE_TIMEOUT_S = 10.0

# how long a rank may stay stopped (SIGSTOP) before it is given up: a stop someone undoes at
# once passes (a scheduler that suspends the whole job stops this controller with it)
STOP_GRACE_S = 5.0


class WorldStartError(RuntimeError):
    def __init__(self, message: str, died: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.died = died  # the ranks seen to die while the world started, first first


class World:
    """A torchrun world that outlives tasks, restarted only when a task leaves it unfit."""

    def __init__(
        self,
        spec: LaunchSpec,
        *,
        base_dir: Path | None = None,
        start_timeout: float = 180.0,
        failure_grace: float = 5.0,
        nodes: Nodes | None = None,  # across machines: the join agents that start other nodes' ranks
    ) -> None:
        self.spec = spec  # this machine's part of the world
        self.nodes = nodes
        self.size = spec.nproc * (nodes.nnodes if nodes else 1)  # ranks in the world
        self.base_dir = base_dir
        self.start_timeout = start_timeout
        self.failure_grace = failure_grace
        self._proc: subprocess.Popen[bytes] | None = None
        self._store = None
        self._dir: Path | None = None
        self._pids: dict[int, int] = {}  # the ranks on this machine
        self.remote: dict[int, int] = {}  # across machines: rank -> its node, for the ranks on other nodes
        self._remote_logs: dict[int, str] = {}  # and where their logs are, there
        self._channel = Channel(None)
        self._seq = 0

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> float:
        self.close()
        began = time.monotonic()
        if self.base_dir is not None:
            self.base_dir.mkdir(parents=True, exist_ok=True)
        self._dir = Path(tempfile.mkdtemp(prefix="world-", dir=self.base_dir))
        host = "127.0.0.1" if self.nodes is None else self.nodes.host  # where other nodes' ranks reach it
        self._store = control_store(host, loopback_only=self.nodes is None)
        self._channel = Channel(self._store, PLAIN if self.nodes is None else self.nodes.seal)
        self._seq = 0
        self._pids = {}
        control = f"{host}:{self._store.port}"
        spec = self.spec
        if self.nodes is not None:
            try:
                spec = self.nodes.launch(self.spec, control)
            except NodeError as exc:
                self.kill()
                raise WorldStartError(f"the world did not start: {exc}") from None
        with open(self._dir / "torchrun.log", "wb") as log:
            self._proc = subprocess.Popen(
                spec.command(),
                env=spec.environment(control, self._dir, self._channel.seal.token),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,  # one process group: killing the world kills every rank
            )
        keys = [protocol.hello_key(r) for r in range(self.size)]
        pauses = procs.pauses()
        starting = procs.StartWatch(protocol.ENV_WORLD_DIR, str(self._dir), self.spec.nproc)
        while not self._store.check(keys):
            starting.look()
            trouble = self.nodes.trouble(self._channel) if self.nodes is not None else None
            if trouble or self._proc.poll() is not None or time.monotonic() - began > self.start_timeout:
                reason = trouble or (
                    f"torchrun exited with {self._proc.returncode}"
                    if self._proc.poll() is not None
                    else f"ranks did not all greet within {self.start_timeout:.0f}s"
                )
                logs = self._logs()
                self.kill()
                raise WorldStartError(f"the world did not start: {reason}\n{logs}", tuple(starting.died))
            time.sleep(next(pauses))
        for rank in range(self.size):
            hello = json.loads(self._channel.get(protocol.hello_key(rank)))
            if hello.get("node", 0) == 0:
                self._pids[rank] = hello["pid"]
            else:  # a pid of another machine: never signalled from here, watched by its agent
                self.remote[rank] = hello["node"]
                self._remote_logs[rank] = hello["log"]
        return time.monotonic() - began

    def kill(self) -> None:
        if self._proc is not None:
            # the process group covers torchrun and its ranks; the pids cover a rank that left it
            for kill, target in [(os.killpg, self._proc.pid), *((os.kill, p) for p in self._pids.values())]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(target, signal.SIGKILL)
            self._proc.wait()
        self._proc = None
        self._store = None
        self._channel = Channel(None)
        self._pids = {}
        self.remote = {}

    def retire(self) -> None:
        """Tell an idle world's ranks to stop, without waiting for torchrun to notice (up to
        its monitor interval); ``close`` reaps it later."""
        if self.alive and self._store is not None:
            self._channel.set(protocol.task_key(self._seq), protocol.Task(protocol.SHUTDOWN).encode())
            self._seq += 1

    def close(self) -> None:
        """Stop the world politely when it is idle and healthy, by force otherwise."""
        if self.alive and self._store is not None:
            self.retire()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=CLOSE_TIMEOUT_S)
        self.kill()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- tasks -------------------------------------------------------------------------

    def run(self, task: protocol.Task, timeout: float) -> Outcome:
        startup = 0.0
        if not self.alive:
            began = time.monotonic()
            try:
                startup = self.start()
            except WorldStartError as exc:
                return Outcome.not_started(str(exc), exc.died, self.size, START, time.monotonic() - began)
        outcome = self._dispatch(task, timeout)
        outcome.startup = startup
        if not outcome.ok:
            # A failed task can leave collectives half-done on some ranks: never reuse the world.
            self.kill()
        return outcome

    def _dispatch(self, task: protocol.Task, timeout: float) -> Outcome:
        assert self._store is not None and self._proc is not None
        seq = self._seq
        self._seq += 1
        began = time.monotonic()
        self._channel.set(protocol.task_key(seq), task.encode())
        results: dict[int, protocol.RankResult] = {}
        first_failure: float | None = None
        stops = procs.Stops()  # the pending ranks of this machine found stopped (SIGSTOP)
        pauses = procs.pauses()
        while True:
            for rank in self._pending(results):
                key = protocol.result_key(seq, rank)
                if self._store.check([key]):
                    results[rank] = protocol.RankResult.decode(self._channel.get(key))
                    self._store.delete_key(key)
                    if not results[rank].ok:
                        first_failure = first_failure or time.monotonic()
            pending = self._pending(results)
            if not pending:
                break
            now = time.monotonic()
            states = {r: procs.process_state(self._pids[r]) for r in pending if r in self._pids}
            dead = {
                r: protocol.RankResult(r, protocol.DIED, error=procs.describe_exit(self._exit_status(r, status)))
                for r, (alive, status) in states.items()
                if not alive
            }
            if self.nodes is not None:  # the other nodes' ranks, as their agents see them
                dead |= self.nodes.losses(self._channel, {r: self.remote[r] for r in pending if r in self.remote})
            # a rank stopped by a signal is given up past a grace, not at the cell timeout
            held = stops.look({r: self._pids[r] for r in pending if r in self._pids}, now)
            halted = {r: t for r, t in held.items() if t > STOP_GRACE_S and r not in dead}
            dead |= {
                r: protocol.RankResult(
                    r,
                    protocol.STOPPED,
                    error=f"the rank process was stopped (SIGSTOP) for {held:.0f}s: it cannot answer until continued",
                    stopped=True,
                )
                for r, held in halted.items()
            }
            if dead or self._proc.poll() is not None:
                results.update(dead)
                if not dead:  # torchrun itself went away: every pending rank is lost
                    for rank in pending:
                        results[rank] = protocol.RankResult(rank, protocol.DIED, error="torchrun exited")
                self._abort(results, protocol.ABORTED, "stopped after a peer rank was lost")
                break
            grace = self._grace(pending)
            if first_failure is not None and now - first_failure > grace:
                self._abort(results, protocol.ABORTED, f"still running {grace:.0f}s after a peer failed")
                break
            if now - began > timeout:
                self._abort(results, protocol.TIMEOUT, f"no result within the cell timeout of {timeout:.0f}s")
                break
            time.sleep(next(pauses))
        duration = time.monotonic() - began
        for r in results.values():
            if not r.ok:
                r.duration = r.duration or duration
                r.log_tail = r.log_tail or self._log_tail(r)
        return Outcome([results[r] for r in range(self.size)], duration, 0.0)

    def _exit_status(self, rank: int, status: int | None) -> int | None:
        """A dead rank's wait status, where its parent reaped it before /proc was read: a rank
        forked by the zygote as its stub left it, one torchrun started as torchrun's log tells it."""
        if status is not None or self._dir is None:
            return status
        if self.spec.zygote is not None:
            return procs.forked_status(self._dir, rank)
        return procs.reaped_status(self._dir / "torchrun.log", self._pids[rank])

    def _grace(self, pending: list[int]) -> float:
        """How long ranks may run on after a peer failed: while another node's ranks are pending,
        long enough to hear its silence (the failure may echo that node's death)."""
        if self.nodes is not None and any(r in self.remote for r in pending):
            return max(self.failure_grace, self.nodes.silence + 2 * BEAT_S)
        return self.failure_grace

    def _log_tail(self, result: protocol.RankResult) -> str | None:
        if result.rank in self.remote and self.nodes is not None:  # what its agent sent, or where to look
            where = f"{self.nodes.name(self.remote[result.rank])}: {self._remote_logs[result.rank]}"
            return result.log_tail or f"(this rank's log is on {where})"
        return procs.tail(self._dir / f"rank{result.rank}.log") if self._dir else None

    def _phase(self, rank: int) -> str | None:
        """What the rank's task last said it was doing (None: nothing)."""
        if rank in self.remote:  # its file is on its machine: it said it in the control store too
            key = protocol.phase_key(rank)
            with contextlib.suppress(RuntimeError, WrongToken):
                if self._channel.store is not None and self._channel.store.check([key]):
                    return self._channel.get(key) or None
            return None
        if self._dir is None:
            return None
        try:
            said = Path(protocol.phase_file(str(self._dir), rank)).read_text(errors="replace").strip()
        except OSError:
            return None
        return said or None

    def _pending(self, results: dict[int, protocol.RankResult]) -> list[int]:
        return [r for r in range(self.size) if r not in results]

    def _abort(self, results: dict[int, protocol.RankResult], status: str, why: str) -> None:
        """Take the stacks of every rank still running, then mark them with ``status``."""
        pending = self._pending(results)
        assert self._dir is not None
        here = {r: self._pids[r] for r in pending if r in self._pids}  # another node's: not signalled from here
        stacks = procs.collect_stacks(self._dir, here)
        for rank in pending:
            halted = rank in self._pids and procs.stopped(self._pids[rank])
            # a rank found stopped when a peer's failure or death ended the task was not waiting
            # on it: it is stopped (the cell timeout's own account keeps TIMEOUT)
            found = protocol.STOPPED if halted and status == protocol.ABORTED else status
            said = why
            if found == protocol.STOPPED:
                said = "the rank process was found stopped (SIGSTOP) when a peer's failure or death ended the task"
            elif halted:
                said = f"{why}: the rank process was stopped (SIGSTOP), not running"
            results[rank] = protocol.RankResult(rank, found, error=said, stacks=stacks.get(rank), stopped=halted)
        # read while the world lives: another node's rank said its phase in the world's store,
        # and which ranks are another node's is forgotten with the world
        for r in results.values():
            if not r.ok:
                r.log_tail = self._log_tail(r)
                if r.status != protocol.FAILED:  # a failed rank's traceback says where it was
                    r.phase = self._phase(r.rank)
        self.kill()

    def _logs(self) -> str:
        if self._dir is None:
            return ""
        parts = [f"[torchrun]\n{procs.tail(self._dir / 'torchrun.log')}"]
        ranks = [r for r in range(self.size) if self.nodes is None or (self._dir / f"rank{r}.log").exists()]
        parts += [f"[rank {r}]\n{procs.tail(self._dir / f'rank{r}.log')}" for r in ranks]
        return "\n".join(parts)

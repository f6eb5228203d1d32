"""The join agent: this node's part of every world of a run across machines
(``python -m conformance.join HOST:PORT``, see ``conformance/join.py``).

It enrols at the controller's agent store with the run's token, keeps a heartbeat counter
moving there, and answers each ``WorldRequest`` by starting torchrun for this node's ranks,
which meet the other nodes' in c10d rendezvous. The controller cannot see this machine's
processes, so the agent watches its ranks as the controller watches its own (/proc) and
reports each death, with the rank's log tail, into the world's control store; and it stops a
world's torchrun as soon as that world's control store goes away. It exits 0 when the
controller says the run is over, 1 when the controller vanishes without saying so, and 2
when it is refused or cannot reach the controller: every exit says why in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from conformance.world import launch, procs, protocol
from conformance.world.launch import ROOT, LaunchSpec, Rendezvous
from conformance.world.protocol import BEAT_S, split_endpoint
from conformance.world.rankloop import NEVER, wait_for
from conformance.world.seal import Channel, Seal, WrongToken

ANSWER_TIMEOUT = datetime.timedelta(seconds=60)  # for the controller to answer a registration
# to connect to a store, and for each request on it: an agent started beside its controller
# (as under Slurm) may have to wait for it to start listening
STORE_TIMEOUT = datetime.timedelta(seconds=300)


class Refused(RuntimeError):
    """The controller turned this agent away, or cannot be reached: the one line says which."""


def say(line: str) -> None:
    print(f"conformance.join: {line}", file=sys.stderr, flush=True)


def _connect(address: str) -> Any:
    import torch.distributed as dist

    host, port = split_endpoint(address)
    return dist.TCPStore(host, port, is_master=False, timeout=STORE_TIMEOUT)


@dataclasses.dataclass
class Part:
    """This node's part of one world: its torchrun, and the ranks of it this agent watches."""

    seq: int
    request: protocol.WorldRequest
    folder: Path
    proc: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Agent:
    """One machine's agent: ``join`` once, then ``serve`` the run's world requests."""

    def __init__(self, endpoint: str, token: str, base_dir: Path) -> None:
        self.endpoint = endpoint
        self.seal = Seal(token)
        self.base_dir = base_dir
        self.node: protocol.Node | None = None
        self.slot = -1  # its join slot: the controller names the agent that serves a node by it
        self._store: Any = None  # the agent store, once joined
        self.parts: list[Part] = []
        self._over = threading.Event()  # stops the heartbeat

    def join(self) -> protocol.Node:
        """Enrol: the node this agent is, or ``Refused`` with the controller's reason."""
        try:
            store = _connect(self.endpoint)
        except (RuntimeError, OSError) as exc:  # c10d: DistNetworkError (a RuntimeError), or TimeoutError
            raise Refused(f"cannot reach the controller at {self.endpoint}: {exc}") from None
        slot = self.slot = store.add(protocol.JOINED, 1)
        me = protocol.Node(-1, socket.gethostname(), os.getpid())  # the controller gives the rank
        Channel(store, self.seal).set(protocol.join_key(slot), me.encode())
        try:
            store.wait([protocol.answer_key(slot)], ANSWER_TIMEOUT)
        except RuntimeError:
            raise Refused(f"the controller at {self.endpoint} did not answer within {ANSWER_TIMEOUT}") from None
        raw = store.get(protocol.answer_key(slot))
        if raw.startswith(protocol.REFUSED.encode()):
            raise Refused(f"refused by the controller at {self.endpoint}: {raw.decode()[len(protocol.REFUSED) :]}")
        try:
            self.node = protocol.Node.decode(self.seal.open(protocol.answer_key(slot), raw))
        except WrongToken:
            why = "its answer is not sealed with this token"
            raise Refused(f"refused by the controller at {self.endpoint}: {why}") from None
        self._store = store
        return self.node

    def serve(self) -> int:
        """Answer world requests until the run is over (0) or the controller is gone (1)."""
        assert self.node is not None
        heartbeat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        heartbeat.start()
        channel = Channel(self._store, self.seal)
        try:
            for seq in itertools.count(self.node.first_world):
                key = protocol.world_key(seq)
                if not wait_for(self._store, key):
                    say(f"the controller at {self.endpoint} is gone without ending the run: this node's worlds stop")
                    return 1
                try:
                    request = protocol.WorldRequest.decode(channel.get(key))
                except WrongToken as exc:  # a stray process wrote it: never obeyed
                    say(f"ignored world request {seq}: {exc}")
                    continue
                if request.over:
                    self._over.set()
                    heartbeat.join()
                    self._store.set(protocol.bye_key(self.node.rank), "bye")
                    say("the run is over")
                    return 0
                holder = request.holders.get(str(self.node.rank), self.slot)
                if holder != self.slot:  # this agent fell silent and another took its node
                    say(f"{self.node} was given to the agent of join slot {holder} after this one fell silent: leaving")
                    return 1
                part = Part(seq, request, self.base_dir / f"world-{seq}")
                self.parts.append(part)
                threading.Thread(target=self._supervise, args=(part,), name=f"world-{seq}", daemon=True).start()
        finally:
            for part in self.parts:
                part.stop()
        return 1

    def _beat(self) -> None:
        """Keep the heartbeat moving; a connection of its own, beside the main thread's wait."""
        assert self.node is not None
        try:
            store = _connect(self.endpoint)
            while not self._over.is_set():
                store.add(protocol.beat_key(self.node.rank), 1)
                self._over.wait(BEAT_S)
        except RuntimeError as exc:  # the controller's store went away: the main thread's wait ends too
            say(f"heartbeat stopped: {exc}")

    def _supervise(self, part: Part) -> None:
        """Start this node's part of a world and watch it until its control store goes away."""
        assert self.node is not None
        request = part.request
        try:
            control = Channel(_connect(request.control), self.seal)
        except RuntimeError as exc:
            say(f"world {part.seq}: its control store at {request.control} is gone already ({exc})")
            return
        try:
            part.folder.mkdir(parents=True)
            devices = launch.device_slice(request.backend, request.nproc, 0)
            rendezvous = Rendezvous(request.nnodes, self.endpoint, request.rdzv_id, node=self.node.rank)
            spec = LaunchSpec(request.nproc, request.backend, devices, rendezvous=rendezvous)
            with open(part.folder / "torchrun.log", "wb") as log:
                env = spec.environment(request.control, part.folder, self.seal.token)
                env[protocol.ENV_AGENT] = str(os.getpid())
                part.proc = subprocess.Popen(
                    spec.command(),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                    start_new_session=True,  # one process group: stopping the part stops every rank
                )
            say(f"world {part.seq}: started {request.nproc} ranks (torchrun pid {part.proc.pid}) in {part.folder}")
            self._watch(part, control)
        except (OSError, RuntimeError) as exc:  # torchrun, its folder, or this node's devices
            with contextlib.suppress(RuntimeError):  # the world may be gone already
                control.set(protocol.fault_key(self.node.rank), f"{self.node} could not start its ranks: {exc}")
                control.store.add(protocol.TROUBLE, 1)
            say(f"world {part.seq}: could not start: {exc}")
        finally:
            part.stop()

    def _watch(self, part: Part, control: Channel) -> None:
        """Report each of this node's ranks that dies, and torchrun's own end, until the
        world's control store goes away (the controller is done with the world)."""
        assert self.node is not None and part.proc is not None
        world_size = part.request.nproc * part.request.nnodes
        hellos = [protocol.hello_key(r) for r in range(world_size)]
        mine: dict[int, int] | None = None  # rank -> pid, once every rank has greeted
        pauses = procs.pauses()
        try:
            while True:
                control.store.check([NEVER])  # raises once the world's store has gone, even before ranks greet
                if mine is None and control.store.check(hellos):
                    greetings = {r: json.loads(control.get(protocol.hello_key(r))) for r in range(world_size)}
                    mine = {r: g["pid"] for r, g in greetings.items() if g.get("node") == self.node.rank}
                for rank, pid in list((mine or {}).items()):
                    alive, status = procs.process_state(pid)
                    if not alive:
                        del mine[rank]
                        if status is None:  # torchrun reaped it first: its log tells how it ended
                            status = procs.reaped_status(part.folder / "torchrun.log", pid)
                        account = f"{procs.describe_exit(status)} on {self.node}"
                        tail = procs.tail(part.folder / f"rank{rank}.log")
                        result = protocol.RankResult(rank, protocol.DIED, error=account, log_tail=tail)
                        control.set(protocol.death_key(rank), result.encode())
                        control.store.add(protocol.TROUBLE, 1)
                if (code := part.proc.poll()) is not None:
                    if code != 0:
                        why = f"torchrun on {self.node} exited with {code}:\n{procs.tail(part.folder / 'torchrun.log')}"
                        control.set(protocol.fault_key(self.node.rank), why)
                        control.store.add(protocol.TROUBLE, 1)
                    wait_for(control.store, NEVER)  # until the world's store goes
                    return
                time.sleep(next(pauses))
        except RuntimeError:  # the world's control store went away: the controller is done with it
            return


def run(endpoint: str, token: str, base_dir: Path | None = None) -> int:
    """Join the run at ``endpoint`` and serve it; the exit status."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="conformance-join-", dir=base_dir))
    agent = Agent(endpoint, token, folder)
    try:
        node = agent.join()
    except (Refused, RuntimeError) as exc:  # RuntimeError: the controller's store failed mid-registration
        say(str(exc))
        shutil.rmtree(folder, ignore_errors=True)
        return 2
    say(f"joined the run at {endpoint} as {node}; worlds' logs in {folder}")
    status = agent.serve()
    if status == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return status

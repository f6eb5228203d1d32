"""The controller's side of a run across machines: its agent store, the nodes that joined it,
and what it can know of a node it cannot see.

The controller listens at ``--rdzv-endpoint HOST:PORT`` with a store that lives as long as
the run. A join agent (``conformance/world/agent.py``) on each other node enrols there, keeps
a heartbeat counter moving, and answers every ``WorldRequest`` by starting its node's part of
that world; the torchruns of all nodes meet in c10d rendezvous held in the same store. The
controller cannot read another node's /proc: its agent reports a rank's death (``death/<r>``)
or its torchrun's end (``fault/<node>``) into the world's control store, and a node whose
heartbeat stops is lost with every rank on it. An agent that joins while a node is lost takes
that node's place (a node rebooted, an agent restarted by Slurm or by hand): the next world
waits up to ``rejoin_timeout`` for one. Every message is sealed with the run's token.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
import threading
import time
import uuid
from typing import Any

from conformance.world import protocol
from conformance.world.launch import LaunchSpec, Rendezvous
from conformance.world.protocol import BEAT_S, split_endpoint
from conformance.world.seal import Channel, Seal, WrongToken

JOIN_TIMEOUT_S = 600.0  # the first world waits this long for every agent to join
SILENCE_S = 10.0  # a heartbeat that has not moved for this long: the node is lost
# how long the first world after a node is lost waits for an agent to take its place; once
# waited out, later worlds fail at once until one comes
REJOIN_TIMEOUT_S = 120.0


class NodeError(RuntimeError):
    """A node the run needs has not joined, or is lost."""


def join_command(endpoint: str, token: str | None = None) -> str:
    """What to run on each other node; ``token`` shown where the controller made it up."""
    prefix = f"CONFORMANCE_TOKEN={token} " if token else ""
    return f"{prefix}python -m conformance.join {endpoint}"


@dataclasses.dataclass
class _Beat:
    count: int  # the agent's counter as last read
    moved: float  # monotonic time it last moved


class Nodes:
    """The nodes of a run: 0 is this process's machine, 1.. one join agent's each."""

    def __init__(
        self,
        endpoint: str,
        nnodes: int,
        token: str,
        *,
        join_timeout: float = JOIN_TIMEOUT_S,
        silence: float = SILENCE_S,
        rejoin_timeout: float = REJOIN_TIMEOUT_S,
    ) -> None:
        import torch.distributed as dist

        self.endpoint = endpoint
        self.host, self._port = split_endpoint(endpoint)
        self.nnodes = nnodes
        self.seal = Seal(token)
        self.join_timeout = join_timeout
        self.silence = silence
        self.rejoin_timeout = rejoin_timeout
        timeout = datetime.timedelta(seconds=60)
        self._store: Any = dist.TCPStore(self.host, self._port, is_master=True, wait_for_workers=False, timeout=timeout)
        self._channel = Channel(self._store, self.seal)
        self._run_id = uuid.uuid4().hex[:12]  # rendezvous ids of this run's worlds
        self._worlds = 0  # world requests posted
        self._lock = threading.Lock()  # the heartbeats
        # a world request and an agent's answer, one at a time: an agent accepted in place of a
        # lost node serves every request after its answer and none before
        self._posting = threading.Lock()
        self.nodes = [protocol.Node(0, socket.gethostname(), os.getpid())]
        self._holders: dict[int, int] = {}  # node rank -> the join slot of its agent
        self._posted: dict[int, dict[int, int]] = {}  # a world's control store's port -> its holders
        self._replaced: dict[int, str] = {}  # node rank -> why its last agent was taken for lost
        self._given_up: set[int] = set()  # lost nodes whose replacement was waited out
        self.refusals: list[str] = []  # one line per agent turned away
        self._beats: dict[int, _Beat] = {}
        self._broken: str | None = None  # why the thread that watches the nodes stopped, if it did
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="nodes", daemon=True)
        self._thread.start()

    # -- the world's side ------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, control: str) -> LaunchSpec:
        """Ask every agent to start its part of a world whose control store is ``control``;
        the controller's own torchrun is ``spec`` as this returns it (node 0's part)."""
        self._wait_for_agents()
        self._wait_for_replacements()
        with self._posting:
            if lost := self.lost():
                raise NodeError("; ".join(lost.values()) + self._not_replaced(lost))
            rdzv_id = f"{self._run_id}-{self._worlds}"
            self._posted[split_endpoint(control)[1]] = dict(self._holders)
            holders = {str(rank): slot for rank, slot in self._holders.items()}
            request = protocol.WorldRequest(spec.nproc, self.nnodes, spec.backend, control, rdzv_id, holders=holders)
            self._channel.set(protocol.world_key(self._worlds), request.encode())
            self._worlds += 1
        return dataclasses.replace(spec, rendezvous=Rendezvous(self.nnodes, self.endpoint, rdzv_id))

    def lost(self) -> dict[int, str]:
        """Node rank -> why it is lost, for every agent whose heartbeat stopped."""
        if self._broken is not None:
            return {node.rank: self._broken for node in self.nodes[1:]}
        now = time.monotonic()
        with self._lock:
            beats = dict(self._beats)
        return {
            node.rank: f"{node} stopped answering: its join agent's heartbeat has not moved for {now - beat.moved:.0f}s"
            for node in self.nodes[1:]
            if now - (beat := beats[node.rank]).moved > self.silence
        }

    def lost_to(self, control: Channel) -> dict[int, str]:
        """``lost()``, and the nodes whose agent was replaced since the world of ``control``
        was asked for: the ranks that agent started are gone with it."""
        lost = self.lost()
        with self._posting:
            posted = self._posted.get(control.store.port, {})
            lost |= {rank: self._replaced[rank] for rank, slot in posted.items() if self._holders[rank] != slot}
        return lost

    def trouble(self, control: Channel) -> str | None:
        """Why a world cannot start: a lost node, or an agent's account of its torchrun."""
        if lost := self.lost_to(control):
            return "; ".join(lost.values())
        if control.store.add(protocol.TROUBLE, 0) == 0:
            return None
        faults = [
            control.get(key) for node in self.nodes[1:] if control.store.check([key := protocol.fault_key(node.rank)])
        ]
        return "\n".join(faults) or None

    def losses(self, control: Channel, where: dict[int, int]) -> dict[int, protocol.RankResult]:
        """The ranks in ``where`` (rank -> its node) that are gone, as their agents report
        them, or with a node that is lost or whose torchrun ended."""
        lost = self.lost_to(control)
        found: dict[int, protocol.RankResult] = {}
        if not lost and control.store.add(protocol.TROUBLE, 0) == 0:
            return found
        for rank, node in where.items():
            if control.store.check([protocol.death_key(rank)]):
                found[rank] = protocol.RankResult.decode(control.get(protocol.death_key(rank)))
            elif control.store.check([protocol.fault_key(node)]):
                found[rank] = protocol.RankResult(rank, protocol.DIED, error=control.get(protocol.fault_key(node)))
            elif node in lost:
                found[rank] = protocol.RankResult(rank, protocol.DIED, error=f"lost with its node: {lost[node]}")
        return found

    def name(self, node: int) -> str:
        return str(self.nodes[node])

    def close(self, grace: float = 5.0) -> None:
        """Tell the agents the run is over and give them ``grace`` seconds to say goodbye (so
        that they exit 0, not as after a controller's death), then stop listening."""
        if self._closed.is_set():
            return
        try:
            self._channel.set(protocol.world_key(self._worlds), protocol.WorldRequest(over=True).encode())
            byes = [protocol.bye_key(node.rank) for node in self.nodes[1:] if node.rank not in self.lost()]
            deadline = time.monotonic() + grace
            while not self._store.check(byes) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            self._closed.set()
            self._thread.join(timeout=5)
            self._store = None

    # -- joining and heartbeats (a thread of its own, on a connection of its own) ---------

    def _wait_for_agents(self) -> None:
        deadline = time.monotonic() + self.join_timeout
        while len(self.nodes) < self.nnodes:
            if time.monotonic() > deadline or not self._thread.is_alive():
                refused = "".join(f"; turned away: {r}" for r in self.refusals)
                raise NodeError(
                    f"{len(self.nodes) - 1} of the {self.nnodes - 1} join agents joined the controller at "
                    f"{self.endpoint} within {self.join_timeout:.0f}s (run `{join_command(self.endpoint)}` "
                    f"with the run's CONFORMANCE_TOKEN on each other node){refused}"
                )
            time.sleep(0.05)

    def _wait_for_replacements(self) -> None:
        """A node lost since the last world: wait for an agent to take its place, once."""
        waiting = set(self.lost()) - self._given_up
        deadline = time.monotonic() + self.rejoin_timeout
        while waiting and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.05)
            waiting &= set(self.lost())
        self._given_up |= waiting

    def _not_replaced(self, lost: dict[int, str]) -> str:
        if set(lost) & self._given_up:
            return (
                f"; no join agent took its place within {self.rejoin_timeout:.0f}s "
                f"(run `{join_command(self.endpoint)}` on a node to replace it)"
            )
        return ""

    def _keep(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # a store or a message gone wrong: every node counts as lost, and says why
            if not self._closed.is_set():
                self._broken = f"the controller stopped watching its nodes: {type(exc).__name__}: {exc}"

    def _serve(self) -> None:
        import torch.distributed as dist

        store = dist.TCPStore(self.host, self._port, is_master=False, timeout=datetime.timedelta(seconds=60))
        waiting: set[int] = set()  # slots taken whose registration has not been answered
        taken = 0
        while not self._closed.wait(BEAT_S):
            joined = store.add(protocol.JOINED, 0)
            waiting.update(range(taken + 1, joined + 1))
            taken = joined
            for slot in sorted(waiting):
                if store.check([protocol.join_key(slot)]):
                    waiting.discard(slot)
                    store.set(protocol.answer_key(slot), self._answer(slot, store.get(protocol.join_key(slot))))
            now = time.monotonic()
            for node in self.nodes[1:]:
                count = store.add(protocol.beat_key(node.rank), 0)
                with self._lock:
                    if self._beats[node.rank].count != count:
                        self._beats[node.rank] = _Beat(count, now)

    def _answer(self, slot: int, raw: bytes) -> str | bytes:
        """The registration in ``slot`` accepted as the next node (sealed), or refused (plain:
        the agent may not have the token to read it)."""
        key = protocol.join_key(slot)
        try:
            asked = protocol.Node.decode(self.seal.open(key, raw))
        except WrongToken:
            why = "wrong token"
        else:
            with self._posting:
                lost = self.lost()
                if len(self.nodes) < self.nnodes or lost:
                    rank = len(self.nodes) if len(self.nodes) < self.nnodes else min(lost)
                    if rank in lost:
                        self._replaced[rank] = lost[rank]
                    node = protocol.Node(rank, asked.host, asked.pid, first_world=self._worlds)
                    with self._lock:
                        self._beats[rank] = _Beat(-1, time.monotonic())
                    self.nodes[rank : rank + 1] = [node]
                    self._holders[rank] = slot
                    self._given_up.discard(rank)
                    return self.seal.close(protocol.answer_key(slot), node.encode())
            why = f"the run has its {self.nnodes} nodes already"
        self.refusals.append(f"join slot {slot}: {why}")
        return protocol.REFUSED + why

"""What the controller and the ranks say to each other over the control store.

The controller owns a c10d ``TCPStore`` per world; the keys down to ``RankResult`` live in
it. Values are JSON so that a rank's result can be read (and logged) without unpickling
foreign objects. A run across machines also has an agent store, where join agents enrol and
are asked to start their node's part of each world (the keys after ``RankResult``); there
every value, and every value of its worlds' stores, is sealed with the run's token
(``conformance/world/seal.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import traceback
from typing import Any

# Environment variables the controller hands to every rank (through torchrun).
ENV_CONTROL = "CONFORMANCE_CONTROL"  # "host:port" of the control store
ENV_WORLD_DIR = "CONFORMANCE_WORLD_DIR"  # per-world folder for rank logs and stack dumps
ENV_BACKEND = "CONFORMANCE_BACKEND"  # "gloo" or "nccl", already resolved, or NO_GROUP
ENV_NODE = "CONFORMANCE_NODE"  # across machines: the node (0: the controller's) that started this rank
ENV_AGENT = "CONFORMANCE_AGENT_PID"  # on another node's ranks: the pid of the join agent that started them
# the file a rank's task writes its phase to (the rank loop sets it per rank; a rank side
# names its phases there, conformance/rank/progress.py), read when the rank cannot answer
ENV_PHASE = "CONFORMANCE_PHASE_FILE"


def phase_file(world_dir: str, rank: int) -> str:
    return os.path.join(world_dir, f"rank{rank}.phase")


def phase_key(rank: int) -> str:
    """Another node's rank names its phase here too: the controller cannot read its file, and
    a node that dies takes its agent (who could have read it) with it."""
    return f"phase/{rank}"


# A world whose processes join no process group at launch: its tasks make their own (a
# simulated world's join torch's fake group as the rank each stands for).
NO_GROUP = "none"

SHUTDOWN = "__shutdown__"


def hello_key(rank: int) -> str:
    return f"hello/{rank}"


# A counter a join agent adds to after each death or fault it reports, so that the controller
# looks at one key per look, however many ranks the other nodes hold.
TROUBLE = "trouble"


def death_key(rank: int) -> str:
    """Set by a join agent when a rank of its node dies: a ``RankResult`` of status DIED."""
    return f"death/{rank}"


def fault_key(node: int) -> str:
    """Set by a join agent when its node's part of the world ends or cannot start: why."""
    return f"fault/{node}"


def task_key(seq: int) -> str:
    return f"task/{seq}"


def result_key(seq: int, rank: int) -> str:
    return f"result/{seq}/{rank}"


@dataclasses.dataclass(frozen=True)
class Task:
    """A call every rank makes: ``fn`` is ``"package.module:function"``, kwargs are JSON."""

    fn: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> Task:
        return cls(**json.loads(raw))


# Rank outcomes. PASSED/FAILED come from the rank itself; the others are the controller's
# verdict on a rank that could not answer.
PASSED = "passed"
FAILED = "failed"  # the task raised on this rank
TIMEOUT = "timeout"  # the cell's deadline passed while this rank was still running it
DIED = "died"  # the rank process exited (signal, os._exit, segfault) mid-task
# the rank process was found stopped (SIGSTOP, a suspended job) and stayed so for STOP_GRACE_S,
# or was found so when a peer's failure or death ended the task: it cannot answer until continued
STOPPED = "stopped"
ABORTED = "aborted"  # a peer failed or died; this rank was stopped while waiting on it


def exception_of(exc: BaseException) -> dict[str, str]:
    """What ``exc`` is, as a front end names it: its type, qualified by its module unless a
    builtin (``torch._dynamo.exc.Unsupported``, ``RuntimeError``), and its message."""
    kind = type(exc)
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    return {"type": f"{module}{kind.__qualname__}", "message": str(exc)}


def frames_of(exc: BaseException) -> list[dict[str, Any]]:
    """The frames of ``exc``'s traceback, outermost first."""
    return [{"file": f.filename, "line": f.lineno, "function": f.name} for f in traceback.extract_tb(exc.__traceback__)]


@dataclasses.dataclass
class RankResult:
    rank: int
    status: str
    value: Any = None
    error: str | None = None  # traceback, or the controller's account of what happened
    stacks: str | None = None  # faulthandler dump taken before the world was killed
    log_tail: str | None = None  # the end of the rank's stdout/stderr
    duration: float = 0.0
    # where the task raised, outermost first: {"file", "line", "function"} per frame, so that
    # the front end can tell whose code raised without reading the traceback's text
    frames: list[dict[str, Any]] | None = None
    # where a rank that could not answer was in its task (its phase file), e.g. "training / step 1 (SGD) / backward"
    phase: str | None = None
    stopped: bool = False  # the controller found the process stopped (SIGSTOP), not running
    exception: dict[str, str] | None = None  # where the task raised: ``exception_of`` it

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> RankResult:
        return cls(**json.loads(raw))

    @property
    def ok(self) -> bool:
        return self.status == PASSED


# -- the agent store of a run across machines ------------------------------------------------


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); ValueError saying what is wrong."""
    host, colon, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{endpoint!r} is not HOST:PORT with a port from 1 to 65535")
    return host, int(port)


BEAT_S = 0.5  # an agent adds to its heartbeat this often; the controller reads them as often
JOINED = "join/count"  # each join agent takes a slot with add(JOINED, 1)


def join_key(slot: int) -> str:
    """An agent's registration (a ``Node`` with its rank unset), sealed with its token."""
    return f"join/{slot}"


def answer_key(slot: int) -> str:
    """The controller's answer: the ``Node`` sealed, or a plain line starting ``REFUSED``."""
    return f"join/{slot}/answer"


REFUSED = "refused: "


def beat_key(node: int) -> str:
    """A counter each agent adds to while it lives: the controller watches it move."""
    return f"node/{node}/beat"


def bye_key(node: int) -> str:
    """Set by an agent that read the request ending the run, before it exits."""
    return f"node/{node}/bye"


def world_key(seq: int) -> str:
    """The controller's ``WorldRequest`` number ``seq``, which every agent answers in turn."""
    return f"world/{seq}"


@dataclasses.dataclass(frozen=True)
class Node:
    """One machine of the run: 0 is the controller's, the others a join agent's each."""

    rank: int
    host: str
    pid: int  # the controller's or the agent's
    # the first world request this node's agent serves: a replacement for a lost node's agent
    # starts at the run's next world, not at the first
    first_world: int = 0

    def __str__(self) -> str:
        return f"node {self.rank} ({self.host})"

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> Node:
        return cls(**json.loads(raw))


@dataclasses.dataclass(frozen=True)
class WorldRequest:
    """Start this node's part of a world: ``nproc`` ranks of torchrun, meeting the others in
    c10d rendezvous ``rdzv_id`` on the agent store, their control store at ``control``. A
    request with ``over`` set ends the run: the agent stops its worlds and exits."""

    nproc: int = 0
    nnodes: int = 0
    backend: str = ""
    control: str = ""
    rdzv_id: str = ""
    over: bool = False
    # node rank -> the join slot of the agent that serves it: an agent that was taken for lost
    # and replaced finds itself named no more, and leaves instead of starting a second part
    holders: dict[str, int] = dataclasses.field(default_factory=dict)

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> WorldRequest:
        return cls(**json.loads(raw))

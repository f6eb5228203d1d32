"""What the controller and the ranks say to each other over the control store.

The controller owns a c10d ``TCPStore`` per world; every key below lives in it. Values are
JSON so that a rank's result can be read (and logged) without unpickling foreign objects.
"""

from __future__ import annotations

import dataclasses
import json
import traceback
from typing import Any

# Environment variables the controller hands to every rank (through torchrun).
ENV_CONTROL = "CONFORMANCE_CONTROL"  # "host:port" of the control store
ENV_WORLD_DIR = "CONFORMANCE_WORLD_DIR"  # per-world folder for rank logs and stack dumps
ENV_BACKEND = "CONFORMANCE_BACKEND"  # "gloo" or "nccl", already resolved, or NO_GROUP
# A world whose processes join no process group at launch: its tasks make their own (a
# simulated world's join torch's fake group as the rank each stands for).
NO_GROUP = "none"

SHUTDOWN = "__shutdown__"


def hello_key(rank: int) -> str:
    return f"hello/{rank}"


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
ABORTED = "aborted"  # a peer failed or died; this rank was stopped while waiting on it


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

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> RankResult:
        return cls(**json.loads(raw))

    @property
    def ok(self) -> bool:
        return self.status == PASSED

"""Runs across machines without a world: the sealing of control messages, the torchrun
command lines and environments of either kind of run, the options, the layout refusal, and
an agent's enrolment (accepted, or refused for a wrong token) at a real agent store."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from conformance.checks.findings import CellResult
from conformance.frontend import options
from conformance.frontend.options import KitConfig
from conformance.frontend.runner import Runner
from conformance.matrix.cells import Cell
from conformance.reports.session import SessionInfo
from conformance.world import protocol, seal
from conformance.world.agent import Agent, Refused
from conformance.world.launch import LaunchSpec, Rendezvous
from conformance.world.nodes import Nodes
from conformance.world.seal import PLAIN, Seal, WrongToken

RESULT = protocol.RankResult(1, protocol.PASSED, {"loss": 0.25}).encode()


def test_a_sealed_result_opens_only_with_the_token_and_under_its_key() -> None:
    sealed = Seal("the run's token").close("result/0/1", RESULT)
    assert b"loss" not in sealed  # a process that lists and reads the store learns nothing
    assert Seal("the run's token").open("result/0/1", sealed) == RESULT
    with pytest.raises(WrongToken, match="not sealed with this run's token"):
        Seal("a guess").open("result/0/1", sealed)
    with pytest.raises(WrongToken, match="sealed for 'result/0/1'"):  # replayed as a later task's result
        Seal("the run's token").open("result/1/1", sealed)
    tampered = bytearray(sealed)
    tampered[40] ^= 1
    with pytest.raises(WrongToken):
        Seal("the run's token").open("result/0/1", bytes(tampered))


def test_one_machine_stores_plain_json_as_before() -> None:
    assert PLAIN.close("result/0/1", RESULT) == RESULT
    assert PLAIN.open("result/0/1", RESULT.encode()) == RESULT
    assert len({seal.new_token() for _ in range(3)}) == 3


def _listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* write them) that listen on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.rpartition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


def test_one_machines_control_store_listens_on_loopback_alone() -> None:
    import torch.distributed as dist

    # its plain tasks name the functions a rank runs: nothing off this machine may reach it
    store = seal.control_store("127.0.0.1", loopback_only=True)
    assert _listening_addresses(store.port) == {"0100007F"}  # 127.0.0.1, and no wildcard
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, wait_for_workers=False)
    client.set("task/0", "ping")
    assert store.get("task/0") == b"ping"
    # a store for other nodes listens where they reach it (its traffic sealed)
    across = seal.control_store("127.0.0.1", loopback_only=False)
    assert _listening_addresses(across.port) & {"00000000", "0" * 32}


def test_launch_one_machine_is_standalone_and_never_seals(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(seal.ENV_TOKEN, "from the shell")
    spec = LaunchSpec(nproc=2, backend="gloo")
    assert "--standalone" in spec.command()
    env = spec.environment("127.0.0.1:1234", tmp_path)
    assert seal.ENV_TOKEN not in env and protocol.ENV_NODE not in env


def test_launch_across_machines_meets_in_the_controllers_store(tmp_path: Path) -> None:
    spec = LaunchSpec(nproc=2, backend="gloo", rendezvous=Rendezvous(3, "head:29500", "run-0", node=2))
    command = spec.command()
    assert "--standalone" not in command and "--nproc-per-node=2" in command
    for arg in ("--nnodes=3", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29500", "--rdzv-id=run-0"):
        assert arg in command
    env = spec.environment("head:4321", tmp_path, token="t")
    assert (env[seal.ENV_TOKEN], env[protocol.ENV_NODE]) == ("t", "2")


@pytest.mark.parametrize(
    ("nnodes", "endpoint", "workers", "says"),
    [
        ("2", None, 1, "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
        ("2", "head", 1, "'head' is not HOST:PORT"),
        ("2", "head:0", 1, "port from 1 to 65535"),
        ("2", "head:29500", 2, "leave out -n"),
        ("1", "head:29500", 1, "only a run with --nnodes above 1"),
        ("0", None, 1, "--nnodes must be at least 1"),
    ],
)
def test_bad_node_options_are_one_line(nnodes: str, endpoint: str | None, workers: int, says: str) -> None:
    with pytest.raises(pytest.UsageError, match=says):
        options.nodes(nnodes, endpoint, workers)


def test_repro_names_the_layout() -> None:
    info = SessionInfo("gloo", 4, "ci", False, Path("xfails.toml"), True, nnodes=2, rdzv_endpoint="head:29500")
    assert info.repro("conformance/test_x.py::t").endswith(
        "--nproc 2 --backend gloo --nnodes 2 --rdzv-endpoint head:29500"
    )


def test_a_cell_off_the_layout_is_unsupported_without_a_world() -> None:
    runner = Runner.__new__(Runner)  # the state run() reads, without pytest's options
    runner.config = KitConfig()
    runner.session = SessionInfo("gloo", 4, "ci", False, Path("xfails.toml"), True, nnodes=2)
    runner.outcomes, runner.worlds = {}, {}
    outcome = runner.run(Cell("mlp", "real", "fsdp_jit", world_size=3))
    assert outcome.ok and len(outcome.results) == 3 and runner.worlds == {}
    assert {CellResult.from_json(v).unsupported for v in outcome.values} == {
        "a world of 3 ranks cannot be laid out on 2 nodes × 2 ranks"
    }
    assert runner._refusal(4) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_agent_with_the_token_joins_and_one_without_is_refused(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{_free_port()}"
    nodes = Nodes(endpoint, 2, "right")
    try:
        with pytest.raises(Refused, match=f"^refused by the controller at {endpoint}: wrong token$"):
            Agent(endpoint, "wrong", tmp_path).join()
        node = Agent(endpoint, "right", tmp_path).join()
        assert node.rank == 1 and [n.rank for n in nodes.nodes] == [0, 1]
        with pytest.raises(Refused, match="the run has its 2 nodes already"):
            Agent(endpoint, "right", tmp_path).join()
        assert nodes.refusals == ["join slot 1: wrong token", "join slot 3: the run has its 2 nodes already"]
    finally:
        nodes.close(grace=0)

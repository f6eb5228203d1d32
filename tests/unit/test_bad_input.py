"""Bad input ends the run before any world starts, with pytest's usage-error status (4) and
one line naming the problem: options the kit checks itself (``--cell-timeout``, ``--replay``,
``--nproc`` and ``--backend nccl`` against the visible GPUs), and a THUNDER_SPEC or
TORCH_SPEC that does not install (tox's install_command, tools/tox_install.py).

No GPU is needed: ``CUDA_VISIBLE_DEVICES=""`` hides any, and tests/support/fake_gpus.py makes the
pytest process see a given number."""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.frontend import options
from conformance.matrix.cells import Cell
from tests.support.fake_gpus import TOO_OLD
from tests.support.suite_runs import ROOT, run_refused

USAGE_ERROR = int(pytest.ExitCode.USAGE_ERROR)
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
GENERATED = Cell(
    "generated",
    "meta_module_init",
    "jit_fsdp",
    tie="tied",
    spec=json.dumps({"widths": [3, 3, 3], "bias": [True, False], "ties": [[0, 1]]}),
)

# case -> (arguments, environment, the line's pattern): one of each kind through the command
# line (a subprocess each: seconds), the other variants of the same checks in process below
BAD = {
    "cell-timeout-zero": (["--cell-timeout", "0"], {}, r"--cell-timeout must be a positive number of seconds, got '0'"),
    "replay-not-json": (["--replay", "{model: mlp}"], {}, r"--replay is not JSON \(Expecting property name"),
    "nccl-no-gpu": (["--backend", "nccl"], NO_GPU, r"--backend nccl: no GPU is visible \(CUDA_VISIBLE_DEVICES=''\)"),
    "nccl-fewer-gpus-than-ranks": (
        ["-p", "tests.support.fake_gpus", "--backend", "nccl"],
        {"CONFORMANCE_FAKE_GPUS": "1"},
        r"--backend nccl: --nproc 2 needs 2 GPUs \(one per rank\), 1 visible",
    ),
    "nccl-nproc-beyond-gpus": (
        ["-p", "tests.support.fake_gpus", "--backend", "nccl", "--nproc", "4"],
        {"CONFORMANCE_FAKE_GPUS": "2"},
        r"--backend nccl: --nproc 4 needs 4 GPUs \(one per rank\), 2 visible",
    ),
    "nccl-driver-too-old": (
        ["-p", "tests.support.fake_gpus", "--backend", "nccl"],
        {"CONFORMANCE_FAKE_GPUS": "2", "CONFORMANCE_FAKE_CUDA_ERROR": TOO_OLD},
        r"--backend nccl: no GPU is usable.*: 2 visible, but torch.cuda.init\(\) raised RuntimeError: "
        + re.escape(TOO_OLD),
    ),
    "nproc-gpus-more-xdist-workers-than-gpus": (
        ["-p", "tests.support.fake_gpus", "-n", "3", "--nproc", "gpus"],
        {"CONFORMANCE_FAKE_GPUS": "2"},
        r"--nproc gpus: 2 GPUs visible.* for 3 xdist workers, whose worlds need at least one each",
    ),
    "min-gpus-beyond-the-workers-share": (
        ["-p", "tests.support.fake_gpus", "-n", "2", "--min-gpus", "2"],
        {"CONFORMANCE_FAKE_GPUS": "3"},
        r"--min-gpus 2: 3 GPUs visible.*, 1 for each of 2 xdist workers, fewer than 2",
    ),
    "affected-by-without-a-map": (
        ["--affected-by", "thunder/distributed/utils.py:40-42"],
        {},
        r"--affected-by needs --coverage-map REPORT, a --thunder-coverage run's report folder",
    ),
    "thunder-coverage-across-machines": (
        ["--thunder-coverage", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29999"],
        {},
        r"--thunder-coverage reads every rank's data on this machine: not --nnodes 2",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_status_4_before_any_world(tmp_path: Path, case: str) -> None:
    args, env, pattern = BAD[case]
    line = run_refused(tmp_path, *args, env=env)
    assert re.search(pattern, line), line


def test_thunder_coverage_needs_a_report_to_write_its_map_into() -> None:
    with pytest.raises(pytest.UsageError, match=r"--thunder-coverage writes coverage-map\.json into the report"):
        options.traced(None, 1)


def test_tox_multigpu_refuses_fewer_than_two_gpus_unless_asked(tmp_path: Path) -> None:
    """tox -e multigpu's own options (tox.ini), on a machine with one GPU: a world of one rank
    would shard nothing, so the run refuses; ``-- --min-gpus 1`` (after them: the last wins)
    asks for it explicitly, and the report then says so (tests/unit/test_cuda_path.py)."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    command = shlex.split(tox["testenv:multigpu"]["commands"])
    ours = command[command.index("conformance") + 1 : command.index("--report-dir")]
    assert ours == ["--backend", "nccl", "--nproc", "gpus", "--min-gpus", "2"]
    line = run_refused(tmp_path, "-p", "tests.support.fake_gpus", *ours, env={"CONFORMANCE_FAKE_GPUS": "1"})
    assert re.fullmatch(
        r"ERROR: --min-gpus 2: 1 GPU visible.*, fewer than 2 \(a world of one rank shards nothing\); to run on 1 "
        r"anyway: --min-gpus 1 \(tox -e multigpu -- --min-gpus 1\)",
        line,
    ), line


# the same checks in process, for the variants a subprocess each would make slow
@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", r"not JSON"),
        ("42", r"expected a JSON object .*got int"),
        ('{"init": "real", "composition": "fsdp_jit"}', r"missing axis 'model'"),
        ('{"model": "mlp", "init": "rael", "composition": "fsdp_jit"}', r"init 'rael' is not one of real, "),
        ('{"model": "mlp", "init": "real", "composition": "fsdp_jit", "world_size": 0}', r"world_size must be"),
        ('{"model": "mlp", "init": "real", "composition": "fsdp_jit", "world_size": true}', r"world_size must be"),
        ('{"model": "mlp", "init": "real", "composition": "fsdp_jit", "dtype": "float16"}', r"dtype 'float16'"),
        ('{"model": "mlp", "init": "real", "composition": "fsdp_jit", "tie": "tied"}', r"cannot exist"),
        ('{"model": "mlp", "init": "meta_original_sd", "composition": "legacy_jit_fsdp"}', r"cannot exist"),
        ('{"model": "generated", "init": "real", "composition": "fsdp_jit"}', r"a spec .* goes with model"),
        ('{"model": "mlp", "init": "real", "composition": "fsdp_jit", "spec": "{}"}', r"a spec .* goes with model"),
        ('["mlp", "real"]', r"expected a JSON object .*got list"),
        (
            '{"model": "mlp", "init": "real", "composition": "fsdp_jit", "shards": 2}',
            r"unknown axis 'shards' \(a cell has ",
        ),
        (
            '{"model": "mlp", "init": "real", "composition": "fsdp_jit", "offload": "disk"}',
            r"offload 'disk' is not one",
        ),
        ('{"model": "generated", "init": "real", "composition": "fsdp_jit", "spec": "[1]"}', r"spec must be a JSON"),
        ('{"model": "generated", "init": "real", "composition": "fsdp_jit", "spec": 3}', r"spec must be a JSON"),
    ],
)
def test_a_malformed_replay_names_what_is_wrong(text: str, pattern: str) -> None:
    with pytest.raises(pytest.UsageError) as info:
        options.parse_replay(text)
    message = str(info.value)
    assert "\n" not in message and message.startswith("--replay"), message
    assert re.search(pattern, message), message


def test_a_generated_cells_tie_must_fit_its_spec() -> None:
    untied = {**GENERATED.axes(), "tie": "untied"}
    with pytest.raises(pytest.UsageError, match=r"tie 'untied' does not fit the spec's ties \[\[0, 1\]\]"):
        options.parse_replay(json.dumps(untied))


@pytest.mark.parametrize(
    "replayed",  # not "cell": the suite's plugin parametrizes every test taking a cell
    [
        GENERATED,
        Cell("mlp", "real", "fsdp_jit"),
        Cell("litgpt_neox", "meta_transformed_sd", "jit_fsdp", tie="untied", sharding="zero3", world_size=3),
    ],
)
def test_what_the_kit_prints_replays(replayed: Cell) -> None:
    assert options.parse_replay(json.dumps(replayed.axes())) == replayed


@pytest.mark.parametrize("option", ["--cell-timeout", "--node-silence", "--rejoin-timeout"])
@pytest.mark.parametrize("value", ["-5", "inf", "-inf", "nan", "-0", "0.0", "soon", ""])
def test_seconds_must_be_finite_and_positive(value: str, option: str) -> None:
    with pytest.raises(pytest.UsageError, match=rf"{option} must be a (positive )?number"):
        options.seconds(value, option)
    assert options.seconds("0.5", option) == 0.5 and options.seconds(300.0, option) == 300.0


def test_nproc_is_settled_into_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options.launch, "visible_cuda_devices", lambda: 3)
    assert options.parse_nproc("gpus") == 3 and options.parse_nproc("4") == 4 and options.parse_nproc(2) == 2
    for bad in ("0", "-1", "two", "2.5"):
        with pytest.raises(pytest.UsageError, match="--nproc must be"):
            options.parse_nproc(bad)
    options.enough_gpus(3)
    with pytest.raises(pytest.UsageError, match=r"--nproc 4 needs 4 GPUs .*3 visible"):
        options.enough_gpus(4)
    monkeypatch.setattr(options.launch, "visible_cuda_devices", lambda: 0)
    with pytest.raises(pytest.UsageError, match="--nproc gpus: no GPU is visible"):
        options.parse_nproc("gpus")


# --- a THUNDER_SPEC or TORCH_SPEC that does not install -------------------------------------


def _tox_install():
    """tools/tox_install.py, a script (tox runs it before anything is installed), as a module."""
    spec = importlib.util.spec_from_file_location("tox_install", ROOT / "tools" / "tox_install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tox_tail(output: str) -> list[str]:
    """The lines from the first of ours on: tox prints its own 'exit 4', 'FAIL code 4' and
    'evaluation failed' lines after it."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in output.splitlines()]
    ours = [n for n, line in enumerate(lines) if line.startswith("ERROR: pip could not install")]
    assert len(ours) == 1, output
    return lines[ours[0] :]


def test_a_spec_that_does_not_install_ends_tox_with_one_line_and_status_4(tmp_path: Path) -> None:
    spec = "lightning-thunder==0.0.0.dev0"  # a version that never existed
    # run from inside tox (tox -e tests), the outer tox's TOX_* variables would read as options
    outer = {k: v for k, v in os.environ.items() if not k.startswith("TOX_") and k != "VIRTUAL_ENV"}
    env = {
        **outer,
        "THUNDER_SPEC": spec,
        "PIP_NO_INDEX": "1",  # tox passes PIP_* through: pip fails at once, offline, as on an index
        "NO_COLOR": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tox", "-c", str(ROOT / "tox.ini"), "--workdir", str(tmp_path), "-e", "conformance"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == USAGE_ERROR, output
    line, *tox_says = _tox_tail(output)
    # the reason is pip's last error (here: no such version; offline elsewhere maybe torch first)
    assert re.fullmatch(rf"ERROR: pip could not install THUNDER_SPEC='{re.escape(spec)}': \S.*", line), output
    assert all(not s.startswith("ERROR") for s in tox_says) and "FAIL code 4" in output, output


@pytest.mark.parametrize(
    ("env", "packages", "named"),
    [
        (
            {"THUNDER_SPEC": "git+https://x/t@b"},
            ["torch==2.11.0", "git+https://x/t@b"],
            "THUNDER_SPEC='git+https://x/t@b'",
        ),
        ({"THUNDER_SPEC": "fork"}, ["torch==2.11.0", "./fork"], "THUNDER_SPEC='fork'"),  # tox's "./" for a path
        ({"TORCH_SPEC": "torch==9"}, ["torch==9", "lightning-thunder==1"], "TORCH_SPEC='torch==9'"),
        ({}, ["torch==2.11.0", "lightning-thunder==1"], "torch==2.11.0 lightning-thunder==1"),
    ],
)
def test_the_line_names_the_spec_given(monkeypatch: pytest.MonkeyPatch, env, packages, named: str) -> None:
    for name in ("THUNDER_SPEC", "TORCH_SPEC"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _tox_install().summary(packages, "why") == f"ERROR: pip could not install {named}: why"

"""One step of ``git bisect run``: the cell's suite run against the Thunder of the checkout
(its root first on PYTHONPATH, which the ranks inherit; nothing is installed), judged from
the step's report.json. ``git bisect run`` calls the command back with ``STEP_FLAG``."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conformance.bisect import git
from conformance.bisect.classify import ABORT, SKIP, Verdict, verdict
from conformance.bisect.git import BadInput

KIT_ROOT = Path(__file__).resolve().parents[2]
STEP_FLAG = "--git-bisect-step"  # how git bisect run calls back into the command


class WrongThunder(Exception):
    """``import thunder`` in a rank would not load the checkout: every step would be a lie."""


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """What every step needs, written once as JSON for the steps git bisect run starts."""

    cell_id: str
    profile: str
    area: str | None = None
    xfails: str | None = None
    pytest_args: tuple[str, ...] = ()
    python: str = sys.executable
    # the user's own PYTHONPATH, kept after the checkout's root
    pythonpath: str | None = None
    state_dir: str = ""

    def pytest_command(self, report_dir: Path) -> list[str]:
        target = f"conformance/test_{self.area}.py" if self.area else "conformance"
        extra = ["--xfails", self.xfails] if self.xfails else []
        return [
            self.python,
            "-m",
            "pytest",
            target,
            "-k",
            self.cell_id,
            "-p",
            "no:cacheprovider",
            "-q",
            "--profile",
            self.profile,
            f"--report-dir={report_dir}",
            *extra,
            *self.pytest_args,
        ]


def import_root(tree: Path) -> Path:
    """The directory that holds the ``thunder`` package: the checkout's root."""
    if not (tree / "thunder" / "__init__.py").is_file():
        raise BadInput(f"{tree} has no thunder/__init__.py: the checkout must be importable from its root")
    return tree


def step_environment(config: StepConfig, root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), config.pythonpath]))
    # No bytecode written into the checkout (it is the user's tree), and none that could be
    # stale: a .pyc is trusted by its source's mtime in seconds and size, which two commits
    # checked out within one second can share.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_thunder_resolves(config: StepConfig, root: Path, env: dict[str, str]) -> None:
    """Where ``import thunder`` goes in a rank: the ranks start in the kit's root with the kit
    prepended to the inherited PYTHONPATH (conformance/world/launch.py); ask the same."""
    rank_env = {**env, "PYTHONPATH": os.pathsep.join([str(KIT_ROOT), env["PYTHONPATH"]])}
    probe = "import importlib.util as u; s = u.find_spec('thunder'); print(s.origin if s else '')"
    proc = subprocess.run(
        [config.python, "-c", probe], cwd=KIT_ROOT, env=rank_env, capture_output=True, text=True, check=False
    )
    found = proc.stdout.strip()
    expected = root / "thunder" / "__init__.py"
    if proc.returncode != 0 or not found or Path(found).resolve() != expected.resolve():
        raise WrongThunder(
            f"import thunder in a rank would load {found or 'nothing'} ({proc.stderr.strip()[-300:]}), "
            f"not {expected}: is a thunder package ahead of PYTHONPATH (a .pth file, the kit's root)?"
        )


def _run_pytest(command: list[str], env: dict[str, str], log: Any) -> None:
    with subprocess.Popen(command, cwd=KIT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT) as proc:
        try:
            proc.wait()
        except KeyboardInterrupt:
            # pytest got the same Ctrl-C: it stops its world itself if given the time
            # (subprocess.run would SIGKILL it a quarter of a second later)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise


def run_step(config: StepConfig, tree: Path, commit: str) -> Verdict:
    """Run the cell against the Thunder in ``tree`` (at ``commit``) and judge it."""
    root = import_root(tree)
    env = step_environment(config, root)
    check_thunder_resolves(config, root, env)
    step_dir = Path(config.state_dir) / commit
    report_dir = step_dir / "report"
    step_dir.mkdir(parents=True, exist_ok=True)
    report_file = report_dir / "report.json"
    report_file.unlink(missing_ok=True)  # a pytest that stops early must not be judged by an older run
    started = time.monotonic()
    with (step_dir / "pytest.log").open("w") as log:
        _run_pytest(config.pytest_command(report_dir), env, log)
    report = json.loads(report_file.read_text()) if report_file.exists() else None
    found = verdict(report, config.cell_id, config.area)
    (step_dir / "verdict.json").write_text(json.dumps(dataclasses.asdict(found)))
    print(f"step {commit[:12]}: {found.word}: {found.reason} ({time.monotonic() - started:.0f} s)", flush=True)
    if found.code == SKIP:
        tail = (step_dir / "pytest.log").read_text().splitlines()[-15:]
        print("\n".join(f"  | {line}" for line in tail), flush=True)
    return found


def saved_verdict(config: StepConfig, commit: str) -> Verdict | None:
    """The verdict ``run_step`` saved for ``commit``, if a step judged it."""
    path = Path(config.state_dir) / commit / "verdict.json"
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return Verdict(**{**raw, "failures": tuple(raw["failures"]), "failed_ids": tuple(raw["failed_ids"])})


def step_main(config_file: Path) -> int:
    """One step of ``git bisect run``: the checkout is the current directory."""
    raw = json.loads(config_file.read_text())
    config = StepConfig(**{**raw, "pytest_args": tuple(raw["pytest_args"])})
    tree = Path(git.run(Path.cwd(), "rev-parse", "--show-toplevel"))
    commit = git.run(tree, "rev-parse", "HEAD")
    try:
        return run_step(config, tree, commit).code
    except WrongThunder as e:
        print(f"ERROR: {e}", file=sys.stderr, flush=True)
        return ABORT  # git bisect run stops at once
    except BadInput as e:  # this commit has no importable thunder package: cannot tell
        print(f"step {commit[:12]}: skip: {e}", flush=True)
        return SKIP
    except KeyboardInterrupt:  # the user stopped the bisect: git got the Ctrl-C too
        return ABORT

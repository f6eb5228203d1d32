"""python -m conformance.bisect --thunder-repo PATH --good REV --bad REV CELL_ID: the first
Thunder commit at which one cell stops conforming, found with ``git bisect run`` in the
Thunder checkout.

Each step imports Thunder from the checkout (its root first on PYTHONPATH, which the ranks
inherit; nothing is installed), runs every check area of the cell (or one, ``--area``) with
pytest in a subprocess and reads the step's report.json:

- 0 (good): the cell conforms: every item passed, or failed only as the xfails file expects;
- 1 (bad): an item failed;
- 125 (skip): the kit cannot tell: collection error, an item erroring, the cell unsupported,
  no item matched, pytest interrupted;
- 128 (abort): ``import thunder`` would not resolve to the checkout.

Exit status: 0 the first bad commit was found, 1 bisect could not decide (skipped commits),
2 interrupted, 4 bad input (not a git repository, unknown revision, uncommitted changes or a
bisect under way in the checkout, a cell id that matches nothing, the cell not conforming at
--good or conforming at --bad).

The module imports nothing else of the kit: it talks to the suite as a user does, through
pytest's command line and report.json (and tests/unit/test_layout.py gives modules at the top of
the package no imports).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

KIT_ROOT = Path(__file__).resolve().parent.parent

# git bisect run's meaning of a step's exit status
GOOD, BAD, SKIP, ABORT = 0, 1, 125, 128
# this command's exit status
FOUND, UNDECIDED, INTERRUPTED, BAD_INPUT = 0, 1, 2, 4

# pytest's exit status when it ran to the end: 0 all passed, 1 some failed, 5 nothing selected
COMPLETED = (0, 1, 5)
# The id is handed to ``pytest -k`` as one identifier: axis values joined by '-', a world size last.
CELL_ID = re.compile(r"[\w.]+(?:-[\w.]+)*-ws\d+")
STEP_FLAG = "--git-bisect-step"  # how git bisect run calls back into this module
_WORDS = {GOOD: "good", BAD: "bad", SKIP: "skip"}


class BadInput(Exception):
    """Input the bisect cannot start from; one line, exit status 4."""


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


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One step's answer, read from its report.json."""

    code: int  # GOOD, BAD or SKIP
    reason: str  # one line
    matched: int = 0  # items of the cell in the run
    failures: tuple[str, ...] = ()  # the message of every failed item
    failed_ids: tuple[str, ...] = ()
    nothing_selected: bool = False  # pytest ran to the end and no item was the cell's

    @property
    def word(self) -> str:
        return _WORDS[self.code]


def _is_item_of(record: dict[str, Any], cell_id: str, area: str | None) -> bool:
    # an item whose fixture broke before the cell ran has no "cell" yet: its node id still names it
    if record.get("cell") != cell_id and not record.get("id", "").endswith(f"[{cell_id}]"):
        return False
    return area is None or record.get("area", _area_of(record.get("id", ""))) == area


def _area_of(node_id: str) -> str:
    return node_id.partition("::")[0].rpartition("/test_")[2].removesuffix(".py")


def _is_stale(record: dict[str, Any]) -> bool:
    """A failure only because an xfails entry covers a cell that conforms: every rank passed.
    For a bisect the cell conforms there (the entry pins a later Thunder's failure)."""
    ranks = record.get("ranks") or []
    return (
        bool(ranks)
        and all(r.get("status") == "passed" and not r.get("failures") for r in ranks)
        and "but xfails entries cover it" in record.get("message", "")
    )


def _without_repro(message: str) -> str:
    """The item's message less the suite's own repro line, which would run the installed Thunder."""
    return "\n".join(line for line in message.splitlines() if not line.startswith("repro: "))


def verdict(report: dict[str, Any] | None, cell_id: str, area: str | None = None) -> Verdict:
    """Map one step's report.json (None: pytest wrote none) to git bisect's good, bad or skip."""
    if report is None:
        return Verdict(SKIP, "pytest wrote no report.json (it stopped before the session ended)")
    items = [r for r in report.get("cells", []) if _is_item_of(r, cell_id, area)]
    status = report.get("exit_status")
    failed = [r for r in items if r["outcome"] == "failed" and not _is_stale(r)]
    if failed:  # evidence even when the run did not finish
        return Verdict(
            BAD,
            f"{len(failed)} of {len(items)} items failed: " + ", ".join(_area_of(r["id"]) for r in failed),
            matched=len(items),
            failures=tuple(_without_repro(r.get("message", "")) for r in failed),
            failed_ids=tuple(r["id"] for r in failed),
        )
    if status not in COMPLETED:
        return Verdict(SKIP, f"pytest exit status {status}: a collection error, usage error or interrupt", len(items))
    if not items:
        return Verdict(SKIP, f"no item matched {cell_id}" + (f" in area {area}" if area else ""), nothing_selected=True)
    unclear = sorted({r["outcome"] for r in items} - {"passed", "xfailed", "failed"})
    if unclear:
        return Verdict(SKIP, "the kit cannot tell: items " + ", ".join(unclear), len(items))
    return Verdict(GOOD, f"{len(items)} items conform", len(items))


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
    path = Path(config.state_dir) / commit / "verdict.json"
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return Verdict(**{**raw, "failures": tuple(raw["failures"]), "failed_ids": tuple(raw["failed_ids"])})


def _git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, ["git", *args], proc.stdout, proc.stderr)
    return proc.stdout.strip()


def step_main(config_file: Path) -> int:
    """One step of ``git bisect run``: the checkout is the current directory."""
    raw = json.loads(config_file.read_text())
    config = StepConfig(**{**raw, "pytest_args": tuple(raw["pytest_args"])})
    tree = Path(_git(Path.cwd(), "rev-parse", "--show-toplevel"))
    commit = _git(tree, "rev-parse", "HEAD")
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


@dataclasses.dataclass(frozen=True)
class Options:
    repo: Path
    good: str
    bad: str
    config: StepConfig


@dataclasses.dataclass(frozen=True)
class Result:
    status: int  # FOUND, UNDECIDED, BAD_INPUT
    lines: list[str]


def resolve(repo_arg: Path, good: str, bad: str) -> tuple[Path, str, str]:
    """The checkout's root and both revisions as full hashes, or BadInput."""
    if not repo_arg.is_dir():
        raise BadInput(f"--thunder-repo {repo_arg}: no such directory")
    try:
        repo = Path(_git(repo_arg, "rev-parse", "--show-toplevel"))
    except subprocess.CalledProcessError:
        raise BadInput(f"--thunder-repo {repo_arg}: not a git repository") from None
    hashes = []
    for flag, rev in (("--good", good), ("--bad", bad)):
        try:
            hashes.append(_git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"))
        except subprocess.CalledProcessError:
            raise BadInput(f"{flag} {rev}: no such commit in {repo}") from None
    if (repo / _git(repo, "rev-parse", "--git-path", "BISECT_START")).exists():  # relative to repo, or absolute
        raise BadInput(f"{repo} is in the middle of a git bisect already: finish it (git bisect reset) first")
    if _git(repo, "status", "--porcelain", "--untracked-files=no"):
        raise BadInput(f"{repo} has uncommitted changes: git bisect would check out over them")
    return repo, hashes[0], hashes[1]


def _export(repo: Path, commit: str, into: Path) -> Path:
    """The tree of ``commit`` in a folder of its own: the premise is checked without touching
    the user's working tree."""
    if not _git(repo, "ls-tree", commit):  # an empty tree: tarfile cannot read its archive
        return into
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout), mode="r:") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12: refuse members escaping the folder
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)
    return into


def _premise(options: Options, step: Callable[[StepConfig, Path, str], Verdict]) -> None:
    """The cell must conform at --good and fail at --bad, else there is nothing to bisect."""
    for flag, commit, expected in (("--good", options.good, GOOD), ("--bad", options.bad, BAD)):
        with tempfile.TemporaryDirectory(prefix=f"thunder-{commit[:12]}-") as tmp:
            try:
                found = step(options.config, _export(options.repo, commit, Path(tmp)), commit)
            except BadInput:
                raise BadInput(
                    f"{flag} {commit[:12]} has no thunder/__init__.py at its root: "
                    "the checkout must be importable from its root"
                ) from None
        if found.code == expected:
            continue
        cell = options.config.cell_id
        if found.nothing_selected:
            raise BadInput(
                f"{cell} matches no item of the {options.config.profile} profile at {flag} {commit[:12]} "
                f"({found.reason}; a cell of another profile needs --profile)"
            )
        if found.code == SKIP:
            raise BadInput(f"cannot tell whether {cell} conforms at {flag} {commit[:12]}: {found.reason}")
        does = "does not conform" if found.code == BAD else "conforms"
        raise BadInput(f"{cell} {does} at {flag} {commit[:12]} ({found.reason}): nothing to bisect")


def _first_bad(log: str) -> str | None:
    for line in log.splitlines():
        if line.startswith("# first bad commit: ["):
            return line.removeprefix("# first bad commit: [").partition("]")[0]
    return None


def _repro(options: Options, commit: str, found: Verdict | None) -> str:
    config = options.config
    target = (
        list(found.failed_ids[:1]) if found and len(found.failed_ids) == 1 else ["conformance", "-k", config.cell_id]
    )
    extra = ["--profile", config.profile, *(["--xfails", config.xfails] if config.xfails else []), *config.pytest_args]
    checkout = shlex.join(["git", "-C", str(options.repo), "checkout", commit])
    pytest = shlex.join(["python", "-m", "pytest", *target, *extra])
    return (
        f"repro: cd {shlex.quote(str(KIT_ROOT))} && {checkout} && PYTHONPATH={shlex.quote(str(options.repo))} {pytest}"
    )


def bisect(options: Options, step: Callable[[StepConfig, Path, str], Verdict] = run_step) -> Result:
    """Check the premise, then ``git bisect run`` this module's step in the checkout."""
    _premise(options, step)
    repo = options.repo
    config_file = Path(options.config.state_dir) / "step.json"
    config_file.write_text(json.dumps(dataclasses.asdict(options.config)))
    # the step imports this module from the kit's root, whatever the checkout's directory holds
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(KIT_ROOT), options.config.pythonpath]))}
    started = False
    run_status = 0
    try:
        _git(repo, "bisect", "start")
        started = True
        _git(repo, "bisect", "bad", options.bad)
        _git(repo, "bisect", "good", options.good)
        if _first_bad(_git(repo, "bisect", "log")) is None:  # else --good is --bad's parent
            run = [options.config.python, "-m", "conformance.bisect", STEP_FLAG, str(config_file)]
            # git's narration ("Bisecting: …", "running …") and each step's line go straight to
            # the user's stdout: a step takes a world's start and a cell's run
            sys.stdout.flush()
            run_status = subprocess.run(
                ["git", "-C", str(repo), "bisect", "run", *run], env=env, check=False
            ).returncode
            print(flush=True)  # git's last line ("bisect found first bad commit") has no newline
        log = _git(repo, "bisect", "log")
        first = _first_bad(log)
        if first is None:
            prefix = "# possible first bad commit: "
            possible = [line.removeprefix(prefix) for line in log.splitlines() if line.startswith(prefix)]
            if not possible:  # a step aborted (128) or git failed: its output is above
                return Result(UNDECIDED, [f"git bisect run stopped (exit status {run_status})"])
            lines = ["bisect could not decide: only commits where the kit cannot tell are left"]
            return Result(UNDECIDED, lines + [f"  possibly {p}" for p in possible])
        subject = _git(repo, "log", "-1", "--format=%s", first)
    except subprocess.CalledProcessError as e:
        return Result(UNDECIDED, [f"git {' '.join(e.cmd[1:])} failed: {(e.stderr or e.stdout).strip()}"])
    finally:
        if started:
            _git(repo, "bisect", "reset", check=False)
    found = saved_verdict(options.config, first)
    lines = [f"first bad commit: {first} {subject}"]
    if found is not None:
        lines.append(f"{options.config.cell_id} at {first[:12]}: {found.reason}")
        lines += [m for m in found.failures]
    lines.append(_repro(options, first, found))
    return Result(FOUND, lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse would exit 2, which here means interrupted: a usage error is bad input
        raise BadInput(f"{message} (see python -m conformance.bisect --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m conformance.bisect",
        description=__doc__.split("\n\n")[0],
        epilog="Arguments after -- go to pytest at every step (e.g. -- --nproc 3 --backend gloo).",
    )
    parser.add_argument(
        "cell", metavar="CELL_ID", help="a cell id, e.g. mlp-real-fsdp_jit-untied-none-zero2-none-float32-ws2"
    )
    parser.add_argument("--thunder-repo", type=Path, required=True, help="a git checkout of Thunder")
    parser.add_argument("--good", required=True, help="a revision at which the cell conforms")
    parser.add_argument("--bad", required=True, help="a later revision at which it does not")
    parser.add_argument("--area", help="only this check area (numerics, memory, ...); default: every area")
    parser.add_argument("--profile", default="ci", help="the profile that holds the cell (default ci)")
    parser.add_argument("--xfails", type=Path, help="known non-conformances (default: the kit's xfails.toml)")
    return parser


def parse(argv: list[str], state_dir: str) -> Options:
    """Options from the command line; BadInput for whatever cannot name a cell or a commit."""
    ours, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = _parser().parse_args(ours)
    if not CELL_ID.fullmatch(args.cell):
        raise BadInput(f"{args.cell!r} is not a cell id (axis values joined by '-', ending in -ws<N>)")
    areas = sorted(p.stem.removeprefix("test_") for p in (KIT_ROOT / "conformance").glob("test_*.py"))
    if args.area is not None and args.area not in areas:
        raise BadInput(f"--area {args.area}: not one of {', '.join(a for a in areas if a != 'generated')}")
    repo, good, bad = resolve(args.thunder_repo, args.good, args.bad)
    config = StepConfig(
        cell_id=args.cell,
        profile=args.profile,
        area=args.area,
        xfails=str(args.xfails.resolve()) if args.xfails else None,
        pytest_args=tuple(pytest_args),
        pythonpath=os.environ.get("PYTHONPATH") or None,
        state_dir=state_dir,
    )
    return Options(repo=repo, good=good, bad=bad, config=config)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [STEP_FLAG]:
        return step_main(Path(argv[1]))
    with tempfile.TemporaryDirectory(prefix="conformance-bisect-") as state:
        try:
            result = bisect(parse(argv, state))
        except (BadInput, WrongThunder) as e:
            print(f"ERROR: {e}", file=sys.stderr)
            return BAD_INPUT
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return INTERRUPTED
    print("\n".join(result.lines))
    return result.status


if __name__ == "__main__":
    sys.exit(main())

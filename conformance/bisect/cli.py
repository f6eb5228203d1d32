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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from conformance.bisect import git
from conformance.bisect.classify import BAD, GOOD, SKIP, Verdict
from conformance.bisect.git import BadInput
from conformance.bisect.step import KIT_ROOT, STEP_FLAG, StepConfig, WrongThunder, run_step, saved_verdict, step_main

# this command's exit status
FOUND, UNDECIDED, INTERRUPTED, BAD_INPUT = 0, 1, 2, 4

# The id is handed to ``pytest -k`` as one identifier: axis values joined by '-', a world size last.
CELL_ID = re.compile(r"[\w.]+(?:-[\w.]+)*-ws\d+")


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


def _premise(options: Options, step: Callable[[StepConfig, Path, str], Verdict]) -> None:
    """The cell must conform at --good and fail at --bad, else there is nothing to bisect."""
    for flag, commit, expected in (("--good", options.good, GOOD), ("--bad", options.bad, BAD)):
        with tempfile.TemporaryDirectory(prefix=f"thunder-{commit[:12]}-") as tmp:
            try:
                found = step(options.config, git.export(options.repo, commit, Path(tmp)), commit)
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
    """Check the premise, then ``git bisect run`` this command's step in the checkout."""
    _premise(options, step)
    repo = options.repo
    config_file = Path(options.config.state_dir) / "step.json"
    config_file.write_text(json.dumps(dataclasses.asdict(options.config)))
    # the step imports this package from the kit's root, whatever the checkout's directory holds
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(KIT_ROOT), options.config.pythonpath]))}
    started = False
    run_status = 0
    try:
        git.run(repo, "bisect", "start")
        started = True
        git.run(repo, "bisect", "bad", options.bad)
        git.run(repo, "bisect", "good", options.good)
        if git.first_bad(git.run(repo, "bisect", "log")) is None:  # else --good is --bad's parent
            run = [options.config.python, "-m", "conformance.bisect", STEP_FLAG, str(config_file)]
            # git's narration ("Bisecting: …", "running …") and each step's line go straight to
            # the user's stdout: a step takes a world's start and a cell's run
            sys.stdout.flush()
            run_status = subprocess.run(
                ["git", "-C", str(repo), "bisect", "run", *run], env=env, check=False
            ).returncode
            print(flush=True)  # git's last line ("bisect found first bad commit") has no newline
        log = git.run(repo, "bisect", "log")
        first = git.first_bad(log)
        if first is None:
            prefix = "# possible first bad commit: "
            possible = [line.removeprefix(prefix) for line in log.splitlines() if line.startswith(prefix)]
            if not possible:  # a step aborted (128) or git failed: its output is above
                return Result(UNDECIDED, [f"git bisect run stopped (exit status {run_status})"])
            lines = ["bisect could not decide: only commits where the kit cannot tell are left"]
            return Result(UNDECIDED, lines + [f"  possibly {p}" for p in possible])
        subject = git.run(repo, "log", "-1", "--format=%s", first)
    except subprocess.CalledProcessError as e:
        return Result(UNDECIDED, [f"git {' '.join(e.cmd[1:])} failed: {(e.stderr or e.stdout).strip()}"])
    finally:
        if started:
            git.run(repo, "bisect", "reset", check=False)
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
    repo, good, bad = git.resolve(args.thunder_repo, args.good, args.bad)
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

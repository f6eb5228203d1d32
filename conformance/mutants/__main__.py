"""``python -m conformance.mutants``: mutation analysis of the Thunder under test.

Each mutant is one of cosmic-ray's (or the kit's own) first-order mutations of one line of
Thunder's distributed stack, made in an overlay copy that the suite imports first; it runs on
the cells that execute its line (``--map``: a ``--thunder-coverage`` report of the same
Thunder), cheapest first, until the first cell that fails. See docs/mutants.md.

Exit status: 0 the analysis ran (whatever it found); 1 the silently-wrong score is under
``--fail-under``, the kit broke on a mutant, or a check killed a mutant the equivalents file
calls equivalent; 4 bad input (one ``ERROR:`` line); 130 stopped by SIGINT or SIGTERM (the
trial under way is dropped, the overlay restored, and the report covers what was judged: the
same command resumes).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from conformance.mutants import equivalents, report, sites, trial
from conformance.mutants.kills import EQUIVALENT, KIT_ERROR, OUTCOMES, Verdict
from conformance.mutants.operators import NAMES, PRESETS
from conformance.mutants.overlay import Overlay, installed_thunder
from conformance.mutants.store import Session
from conformance.reports import changed_lines
from conformance.reports.coverage_map import CoverageMap, source_digest

DEFAULT_EQUIVALENTS = trial.KIT_ROOT / "mutants-equivalent.toml"


class BadInput(Exception):
    pass


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m conformance.mutants", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--map", type=Path, required=True, help="a --thunder-coverage report folder (or its coverage-map.json)"
    )
    p.add_argument("--files", nargs="+", default=list(sites.DEFAULT_FILES), help="Thunder-relative files to mutate")
    p.add_argument("--function", default=None, help="only mutants inside this function (its name)")
    p.add_argument(
        "--operators",
        nargs="+",
        default=None,
        help="only these operators (core/..., kit/...), or 'kept-running': "
        "those whose mutants tend to keep Thunder running",
    )
    p.add_argument("--diff", default=None, metavar="A..B", help="only mutants on lines commits A..B changed")
    p.add_argument("--thunder-repo", type=Path, default=None, help="with --diff: a git checkout of Thunder")
    p.add_argument("--sample", type=int, default=None, metavar="N", help="a seeded sample of N mutants")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("mutants"), help="the session, the overlay, the reports")
    p.add_argument("--equivalents", type=Path, default=DEFAULT_EQUIVALENTS, help="the reviewed equivalents file")
    p.add_argument(
        "--resume-from",
        type=Path,
        default=None,
        metavar="JSON",
        help="an earlier analysis's mutants.json: its verdicts stand for the mutants it judged "
        "(a census carried to a fresh machine)",
    )
    p.add_argument("--list", action="store_true", help="list the selected mutants and their cells; run nothing")
    p.add_argument("--report-only", action="store_true", help="write the reports of what the session judged")
    p.add_argument(
        "--rejudge",
        choices=OUTCOMES,
        default=None,
        metavar="OUTCOME",
        help="judge again the mutants judged OUTCOME (e.g. 'the kit broke', after fixing the kit)",
    )
    p.add_argument("--fail-under", type=float, default=None, metavar="PCT", help="exit 1 under this silent score")
    p.add_argument("--trial-timeout", type=float, default=3600.0, help="seconds one mutant's suite may run")
    p.add_argument("suite_args", nargs="*", help="after --: options for the suite (e.g. --cell-timeout 120)")
    return p.parse_args(argv)


def select(args: argparse.Namespace, root: Path, cmap: CoverageMap) -> tuple[list[sites.Mutant], list[sites.Mutant]]:
    """(every mutant of the files, the selection) after checking the map is of this source."""
    for path in args.files:
        if not (root / path).is_file():
            raise BadInput(f"--files {path}: no such file in the Thunder at {root}")
        known = cmap.files.get(path)
        text = (root / path).read_text()
        if known is None or known.sha256 != source_digest(text):
            raise BadInput(
                f"--map {args.map}: made of another source of {path}; run --thunder-coverage on this Thunder"
            )
    every = sites.all_sites(root, args.files)
    if args.operators is not None:
        args.operators = [n for name in args.operators for n in PRESETS.get(name, (name,))]
    if args.operators is not None and (unknown := sorted(set(args.operators) - set(NAMES))):
        raise BadInput(f"--operators {' '.join(unknown)}: no such operator (python -m conformance.mutants --help)")
    chosen = [
        m
        for m in every
        if (args.function is None or m.function == args.function)
        and (args.operators is None or m.operator in args.operators)
    ]
    if args.diff is not None:
        if args.thunder_repo is None:
            raise BadInput("--diff needs --thunder-repo, a git checkout of Thunder")
        head = args.diff.partition("..")[2]
        for path in args.files:
            at_head = changed_lines.file_at(args.thunder_repo, head, path)
            if at_head is not None and source_digest(at_head) != cmap.files[path].sha256:
                raise BadInput(f"--diff {args.diff}: {path} at {head} is not the installed Thunder's")
        try:
            changed = changed_lines.from_git(args.thunder_repo, args.diff, args.files)
        except (ValueError, OSError) as exc:
            raise BadInput(str(exc)) from None
        chosen = [m for m in chosen if set(m.lines) & changed.get(m.path, set())]
    return every, sites.sample(chosen, args.sample, args.seed)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        cmap = CoverageMap.load(args.map)
    except (OSError, ValueError, KeyError) as exc:
        print(f"ERROR: --map {args.map}: no coverage map there ({exc})", file=sys.stderr)
        return 4
    root = installed_thunder()
    try:
        every, chosen = select(args, root, cmap)
        reviewed = equivalents.load(args.equivalents, every, trial.device(tuple(args.suite_args)))
        blind = equivalents.blind_spots(args.equivalents, every)
    except (BadInput, equivalents.EquivalentsError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 4
    if args.list:
        for m in chosen:
            print(m.id, len(trial.cells_for(m, cmap)), "cells")
        return 0
    session = Session(args.out / "session.sqlite")
    try:
        added = session.add(chosen)
        if args.resume_from is not None:
            try:
                earlier = json.loads(args.resume_from.read_text())["mutants"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                print(f"ERROR: --resume-from {args.resume_from}: no mutants.json there ({exc})", file=sys.stderr)
                return 4
            print(f"{session.adopt(earlier)} verdicts taken from {args.resume_from}", flush=True)
        if args.rejudge is not None:
            print(f"{session.forget(args.rejudge)} mutants judged {args.rejudge!r} to judge again", flush=True)
        # the cheapest first (fewest cells to run), so that an analysis stopped early has
        # judged the most mutants; a line every cell runs (import time) goes last
        asked = {m.id for m in chosen}  # this command's selection: a session may hold more
        pending = sorted(
            (m for m in session.pending() if m.id in asked),
            key=lambda m: (len(trial.cells_for(m, cmap)), m.id),
        )
        stopped = False
        if not args.report_only:
            print(f"{added} mutants added, {len(pending)} to judge ({args.out / 'session.sqlite'})", flush=True)
            stopped = judge(pending, session, reviewed, cmap, root, args)
        data = report.build(session.judged(), reviewed, cmap, blind)
    finally:
        session.close()
    (args.out / "mutants.json").write_text(json.dumps(data, indent=2))
    (args.out / "mutants.md").write_text(report.markdown(data))
    print(report.markdown(data).split("\n\n")[1])
    broke = data["score"]["counts"].get(KIT_ERROR, 0)
    silent = data["score"]["silent_score"]
    under = args.fail_under is not None and (silent is None or 100 * silent < args.fail_under)
    if stopped:
        return 130
    return 1 if broke or under or data["equivalence_refuted"] else 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def judge(
    pending: list[sites.Mutant],
    session: Session,
    reviewed: dict[str, equivalents.Equivalent],
    cmap: CoverageMap,
    root: Path,
    args: argparse.Namespace,
) -> bool:
    """Judge ``pending`` in turn; whether a signal stopped it first. SIGTERM stops it as
    Ctrl-C does: the trial under way unwinds, so its file in the overlay is restored."""
    overlay = Overlay(args.out / "overlay", root)
    if overlay.restored:
        print(f"the overlay held files an earlier analysis left mutated, restored: {', '.join(overlay.restored)}")
    plan = trial.Plan(cmap, args.out, tuple(args.suite_args), args.trial_timeout)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for i, mutant in enumerate(pending, 1):
            started = time.perf_counter()
            if mutant.id in reviewed:
                original = (root / mutant.path).read_text()
                verdict = Verdict(EQUIVALENT)
                diff = trial.diff_of(mutant, original, mutant.mutated(original) or original)
            else:
                verdict, diff = trial.run(mutant, overlay, plan, args.out / "trial")
            session.record(mutant, verdict, diff)
            where = f" at {verdict.cell} ({', '.join(verdict.areas)})" if verdict.cell else ""
            print(
                f"[{i}/{len(pending)}] {verdict.outcome}{where}: {mutant.id} "
                f"({verdict.cells_run} cells, {time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    except KeyboardInterrupt as exc:
        print(f"stopped ({exc or 'SIGINT'}): the same command resumes", flush=True)
        return True
    finally:
        signal.signal(signal.SIGTERM, previous)
    return False


if __name__ == "__main__":
    sys.exit(main())

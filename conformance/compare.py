"""python -m conformance.compare OLD NEW: two runs compared (each a report.json or a report
folder); python -m conformance.compare --history DIR: every cell across nightly report folders.

Exit status: 0 no regression, 1 a regression (capability lost: an item that passed is
xfailed, unsupported or skipped now, or vanished; an item newly failing or erroring; a metric
beyond noise in the bad direction) that no --accept names, 4 unreadable input (one line on
stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.reports import json_text
from conformance.reports.comparison import UnreadableReport, compare, read_report
from conformance.reports.comparison_markdown import markdown
from conformance.reports.history import history_figure, nights

USAGE_ERROR = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, metavar="OLD NEW", help="two report.json files or report folders")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="write the Markdown here instead of stdout")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the comparison as JSON here too")
    parser.add_argument(
        "--accept",
        action="append",
        default=[],
        metavar="CELL_OR_AREA",
        help="an intended change: regressions of this item id, cell id or area (or fnmatch glob, e.g. '*-jit_ddp-*') "
        "are listed as accepted and leave the exit status 0; repeatable",
    )
    parser.add_argument("--history", type=Path, metavar="DIR", help="a folder of nightly report folders to picture")
    parser.add_argument("--out", type=Path, metavar="PNG", help="where --history writes (default: DIR/history.png)")
    args = parser.parse_args(argv)
    if (args.history is None) == (len(args.runs) != 2):
        parser.error("give OLD and NEW, or --history DIR")
    try:
        if args.history is not None:
            return _history(args.history, args.out or args.history / "history.png")
        old, new = (read_report(p) for p in args.runs)
    except UnreadableReport as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return USAGE_ERROR
    comparison = compare(old, new, str(args.runs[0]), str(args.runs[1]), accept=args.accept)
    text = markdown(comparison)
    if args.markdown is not None:
        args.markdown.write_text(text)
    else:
        print(text)
    if args.json is not None:
        args.json.write_text(json_text.dumps(comparison.to_json(), indent=2))
    return 1 if comparison.regressions else 0


def _history(folder: Path, out: Path) -> int:
    runs = nights(folder)
    history_figure(runs, out)
    print(f"{out}: {len(runs)} nights, {runs[0].label} to {runs[-1].label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

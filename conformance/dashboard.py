"""python -m conformance.dashboard FOLDER [--out DIR]: a static site over a folder of report
folders (nights, or one per Thunder version, each holding a report.json): index.html with
the runs-by-areas table, each run's regressions and fixes against the run before it, the
history as charts, and each run's report.html. Every page needs nothing outside itself.

Exit status: 0 written, 4 unreadable input (one line on stderr). Regressions set no status
here: `python -m conformance.compare` is the gate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.reports.comparison import UnreadableReport
from conformance.reports.site import build

USAGE_ERROR = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.dashboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder of report folders (each holding a report.json)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="where the site goes (default: FOLDER/dashboard)")
    args = parser.parse_args(argv)
    try:
        index = build(args.folder, args.out or args.folder / "dashboard")
    except UnreadableReport as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return USAGE_ERROR
    print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""docs/gpu-runs.md's table of one ``tools/gpu/device_run.sh`` run: ``python
tools/gpu/runs_table.py OUT`` reads the run's folder (steps.txt, env.txt, reports.tgz) and
prints one row per step: what it came to (a suite's outcome counts from its report.json, a
planted bug's whether it made its run fail) and its wall time."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import tarfile
from pathlib import Path

STEP = re.compile(r"^STEP (?P<name>\S+) (?:rc=(?P<rc>\d+) wall (?P<wall>\d+)s|skipped: (?P<why>.*))$")


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    rc: int | None  # None: skipped
    wall: int | None  # seconds
    why: str | None = None  # why it was skipped

    def outcome(self, report: dict | None) -> str:
        if self.rc is None:
            return f"skipped: {self.why}"
        if self.name.startswith("planted_"):
            return "made the run fail" if self.rc == 1 else f"**did not make the run fail** (exit {self.rc})"
        if report is None:
            return f"no report (exit {self.rc})"
        counts = ", ".join(f"{n} {k}" for k, n in sorted(report.get("counts", {}).items()))
        items = sum(report.get("counts", {}).values())
        return f"{items} items: {counts}; exit {report.get('exit_status', self.rc)}"


def steps(out: Path) -> list[Step]:
    found = []
    for line in (out / "steps.txt").read_text().splitlines():
        m = STEP.match(line.strip())
        if m is None:
            continue
        rc, wall = (int(m["rc"]), int(m["wall"])) if m["rc"] is not None else (None, None)
        found.append(Step(m["name"], rc, wall, m["why"]))
    return found


def reports(out: Path) -> dict[str, dict]:
    """Each step's report.json, by the step's name (its folder in reports.tgz)."""
    archive = out / "reports.tgz"
    if not archive.exists():
        return {}
    found = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) >= 2 and parts[-1] == "report.json" and (f := tar.extractfile(member)) is not None:
                found[parts[-2]] = json.load(f)
    return found


def table(out: Path) -> str:
    rows = ["| step | outcome | wall |", "|---|---|---|"]
    found = reports(out)
    for step in steps(out):
        wall = f"{step.wall} s" if step.wall is not None else "-"
        rows.append(f"| {step.name} | {step.outcome(found.get(step.name))} | {wall} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out", type=Path, help="the run's folder (device_run.sh's $OUT)")
    args = parser.parse_args(argv)
    if not (args.out / "steps.txt").exists():
        print(f"{args.out}: no steps.txt: not a device_run.sh folder", file=sys.stderr)
        return 2
    print(table(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

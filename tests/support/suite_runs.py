"""Running the conformance suite as a user would, in a subprocess, and reading its reports."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import os
import select
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Collection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def probed_on_this_machine() -> dict[str, str]:
    """The values the pin's probe refuses on a machine without a GPU, as the front end's
    ``unsupported`` mapping: each composition and executor whose probe, asked here about the
    CPU, gives a reason (the legacy composition, removed from Thunder; nvFuser, which needs
    CUDA; the plugins API's default recipe, which needs nvFuser; DDP's compositions are
    offered)."""
    import torch

    from fixtures.compositions import COMPOSITIONS, pair_probes
    from fixtures.executors import EXECUTORS

    cpu = torch.device("cpu")
    probed = {n: v.probe for n, v in {**COMPOSITIONS, **EXECUTORS}.items() if v.probe is not None}
    found = {n: reason for n, probe in probed.items() if (reason := probe(cpu))}
    # the pairs a composition refuses (the plugins API's default recipe without nvFuser), as
    # conformance/rank/probe.py asks them: of the compositions and executors offered
    pairs = pair_probes(lambda name: name not in found)
    found.update({pair: reason for pair, probe in pairs.items() if (reason := probe(cpu))})
    return found


def unsupported_values(report: dict[str, Any]) -> dict[str, str]:
    """Probed value -> reason, as the cells a run reported unsupported say (one value each)."""
    from conformance.matrix.axes import PROBED_AXES
    from conformance.matrix.cells import axis_value
    from fixtures.compositions import pairing

    probed = probed_on_this_machine()
    out = {}
    for c in report["cells"]:
        if c["outcome"] == "unsupported":
            pair = pairing(axis_value(c["axes"], "composition"), axis_value(c["axes"], "executors"))
            if pair in probed:  # a refused pair's stand-in: both its values run elsewhere
                out[pair] = c["message"]
                continue
            for axis in PROBED_AXES:
                value = axis_value(c["axes"], axis)
                if value in probed or (axis == "offload" and value != "none"):
                    out[value] = c["message"]
    return out


@dataclasses.dataclass
class SuiteRun:
    returncode: int
    output: str
    report: dict[str, Any]
    jsonl: list[dict[str, Any]]
    summary: str
    junit: ET.Element
    report_dir: Path

    def outcomes(self, area: str) -> dict[str, str]:
        """cell id -> outcome, for the items of one check area."""
        return {c["cell"]: c["outcome"] for c in self.report["cells"] if c.get("area") == area}


class Driver:
    """This process's tests/support/suite_driver.py: the suite runs there, one run after
    another, on one pool of worlds. Started on first use, stopped at exit."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def run(self, args: list[str], env: dict[str, str], output: Path, timeout: float) -> int:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.suite_driver"],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                start_new_session=True,  # a timeout kills it; its worlds' ranks follow their controller
            )
            atexit.register(self.stop)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"args": args, "env": env, "output": str(output)}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.kill()
            said = output.read_text(errors="replace") if output.exists() else ""
            if not ready:
                raise subprocess.TimeoutExpired(args, timeout, said)
            raise RuntimeError(f"the suite driver died\n{said}")
        return json.loads(line)["returncode"]

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # its loop ends and it closes its worlds
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


DRIVER = Driver()


def run_suite(
    tmp: Path,
    *args: str,
    paths: tuple[str, ...] = ("conformance",),
    env: dict[str, str] | None = None,
    plant: bool = False,
    timeout: float = 600,
    shared: bool = True,
) -> SuiteRun:
    """Run the suite: ``plant`` loads tests/support/plant_plugin.py (with ENV naming the bug);
    ``shared``: in this process's driver, on its pool of worlds (a run that starts or counts
    worlds itself, or spawns xdist workers, needs a process of its own: False)."""
    report_dir = tmp / "report"
    junit = tmp / "junit.xml"
    argv = [
        *paths,
        *(["-p", "tests.support.plant_plugin"] if plant else []),
        "-p",
        "no:cacheprovider",
        "-q",
        f"--report-dir={report_dir}",
        f"--junitxml={junit}",
        # every run probes as a fresh machine would (a planted probe fault must meet a probe),
        # unless the test asks for the cache itself
        *([] if any(a.startswith("--probe-cache") for a in args) else ["--probe-cache=none"]),
        *args,
    ]
    if shared:
        tmp.mkdir(parents=True, exist_ok=True)
        returncode = DRIVER.run(argv, env or {}, tmp / "output.txt", timeout)
        output = (tmp / "output.txt").read_text(errors="replace")
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *argv],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    assert (report_dir / "report.json").exists(), output
    return SuiteRun(
        returncode=returncode,
        output=output,
        report=json.loads((report_dir / "report.json").read_text()),
        jsonl=[json.loads(line) for line in (report_dir / "report.jsonl").read_text().splitlines()],
        summary=(report_dir / "summary.md").read_text(),
        junit=ET.parse(junit).getroot(),
        report_dir=report_dir,
    )


# .ci/run runs `tox -e conformance` (the ci profile, reports in reports/) and then the kit's
# tests, whose end-to-end tests would run that same profile again: it names the folder here.
CI_REPORT_ENV = "CONFORMANCE_CI_REPORT"


def verdict_of(report: dict[str, Any]) -> str:
    """What a report says made its exit status: the counts, the stale templates and each cell
    that failed, with the first line of its message (CI prints this; its reports are gone)."""
    lines = [f"exit status {report['exit_status']}: {report['counts']}"]
    lines += [f"stale: {s['template']} {s['text']}" for s in report["xfail_templates"]["stale"]]
    for item in report["cells"]:
        if item["outcome"] not in ("passed", "xfailed", "unsupported"):
            first_line = (item.get("message") or "").partition("\n")[0]
            lines.append(f"{item['outcome']}: {item['id']}: {first_line[:300]}")
    return "\n".join(lines)


def reused_ci_run() -> SuiteRun | None:
    """The ci run that CI_REPORT_ENV names, or None where it names none. It must be a whole
    run of the ci profile, written by this very commit, unmodified, or the test fails saying why."""
    folder = os.environ.get(CI_REPORT_ENV)
    if not folder:
        return None
    report_dir = Path(folder)
    report = json.loads((report_dir / "report.json").read_text())
    from conformance.reports.environment import kit_checkout

    here = kit_checkout()
    written_by = report["environment"].get("kit")
    problems = [
        f"profile {report['profile']!r}, not 'ci'" if report["profile"] != "ci" else "",
        "a narrowed run (-k, -m or a path)" if not report.get("whole_run") else "",
        f"written by kit {written_by}, this is {here}" if written_by != here else "",
        "this checkout is not an unmodified commit" if here["commit"] is None or here["modified"] else "",
    ]
    if any(problems):
        raise AssertionError(
            f"{CI_REPORT_ENV}={folder} cannot stand for the ci run: " + "; ".join(p for p in problems if p)
        )
    return SuiteRun(
        returncode=report["exit_status"],
        output=f"(the ci run of {folder}, whose reports CI does not keep) " + verdict_of(report),
        report=report,
        jsonl=[json.loads(line) for line in (report_dir / "report.jsonl").read_text().splitlines()],
        summary=(report_dir / "summary.md").read_text(),
        junit=ET.parse(report_dir / "junit.xml").getroot(),
        report_dir=report_dir,
    )


def run_refused(tmp: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run the suite with bad input: it must end with pytest's usage-error status (4) and one
    ``ERROR:`` line, before any world starts. That line."""
    report_dir = tmp / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", f"--report-dir={report_dir}", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 4, output
    lines = output.strip().splitlines()  # pytest ends a usage error with a blank line
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), output
    assert not (report_dir / "worlds").exists(), "a world was started"
    return lines[0]


def offered(cell: Any, probed: Collection[str]) -> bool:
    """Whether no value of ``cell``, nor its pair of a composition and executors, is probed."""
    from fixtures.compositions import pairing

    return not {cell.composition, cell.executors, pairing(cell.composition, cell.executors)} & set(probed)


@functools.cache
def _pins_entries() -> tuple[Any, ...]:
    """The xfails entries that hold for the Thunder installed here (the pin)."""
    from importlib.metadata import version

    from conformance.frontend.xfails import load

    pin = version("lightning-thunder")
    return tuple(e for e in load(ROOT / "xfails.toml") if e.holds_for(pin))


def pins_entries_naming(cell: Any, area: str) -> list[Any]:
    """The xfails entries of the pin that name ``cell`` in ``area`` (on gloo)."""
    return [e for e in _pins_entries() if e.names(cell, area, "gloo")]


def ends_at_expected_raise(cell: Any) -> bool:
    """Whether a raises entry of the pin expects ``cell`` to raise (on gloo): it ends there."""
    return any(e.raise_templates_for(cell, "gloo") for e in pins_entries_naming(cell, "numerics"))


def runs_to_the_end(cell: Any, probed: Collection[str]) -> bool:
    """Whether ``cell`` trains through every phase on the pin here: ``offered``, not negative
    (Thunder must refuse its model), training (an inference cell has no backward, step or round
    trip) and not ending at a raise a raises entry of the pin expects (the torchcompile cells on
    the CPU)."""
    from conformance.matrix.initialization import expects_reset_error
    from fixtures.options import INFERENCE

    return (
        offered(cell, probed)
        and not expects_reset_error(cell)
        and cell.scenario != INFERENCE
        and not ends_at_expected_raise(cell)
    )

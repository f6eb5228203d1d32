"""The composition probe, the first task a world of the session's size runs: what the Thunder
under test offers, asked once more on a fresh world when it does not complete (a rank died or
hung at the world's first collective: a flaky NCCL init, say), and, failing twice, the end of
the run: no item, one ``ERROR:`` line, exit status ``PROBE_FAILED``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conformance.world.outcome import Outcome

PROBE = "conformance.rank.probe:probe_compositions"  # composition -> why unsupported, or None
# The exit status of a run whose composition probe did not complete twice: nothing was
# judged, and the kit or the world broke, not Thunder (pytest's own statuses end at 5)
PROBE_FAILED = 6


def ask(run_once: Callable[[], Outcome], nproc: int, warnings: list[str]) -> tuple[dict[str, str] | None, str | None]:
    """(composition -> why unsupported, None), or (None, why the run ends) where the probe
    did not complete twice. ``run_once`` runs the probe on the session's world (a failed task
    kills its world, so a second call starts a fresh one); what the run should be told of a
    failed try goes to ``warnings``."""
    tries: list[str] = []
    for _ in range(2):
        outcome = run_once()
        if outcome.ok:
            break
        tries.append(outcome.describe())
    where = f"the composition probe ({PROBE}) on a world of {nproc} ranks"
    if not outcome.ok:
        failure = f"{where} did not complete, twice: nothing was judged (the kit or the world broke)"
        warnings.append(f"{failure}; its ranks said:\n" + "\n".join(tries))
        return None, failure
    if tries:
        warnings.append(f"{where} did not complete at first and did on a fresh world:\n{tries[0]}")
    unsupported: dict[str, str] = {}
    for answer in outcome.values:
        assert isinstance(answer, dict), answer
        for name, reason in answer.items():
            if reason is not None:
                unsupported.setdefault(name, reason)
    return unsupported, None


class RunEnd:
    """pytest hooks that end a run whose probe failed twice; ``runner`` is the controller's,
    or an xdist worker's (the worker hands the failure to the controller)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    @pytest.hookimpl(tryfirst=True)  # before the kit's plugin orders the items by their cells
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if self.runner.probe_failure is not None and items:  # nothing is judged: not a generated model either
            config.hook.pytest_deselected(items=list(items))
            items[:] = []

    @pytest.hookimpl(tryfirst=True)  # before the report writer reads the exit status
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.runner.probe_failure is not None:
            session.exitstatus = PROBE_FAILED
            if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller ends the run
                session.config.workeroutput["probe_failure"] = self.runner.probe_failure
                session.config.workeroutput["run_warnings"] = self.runner.run_warnings

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """xdist's controller collects nothing itself: a worker whose probe failed twice says so."""
        output = getattr(node, "workeroutput", None) or {}
        if output.get("probe_failure") and self.runner.probe_failure is None:
            self.runner.probe_failure = output["probe_failure"]
            self.runner.run_warnings.extend(output.get("run_warnings", []))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.runner.probe_failure is not None:
            terminalreporter.write_line(f"ERROR: {self.runner.probe_failure}")

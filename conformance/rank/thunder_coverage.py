"""Which lines of the Thunder under test a task runs (``--thunder-coverage``): coverage.py in
this rank, its tracer limited to the files the front end names, one dynamic context per task
(the cell's id, or ``probe``).

The tracer starts at this process's first traced task and stays on: Thunder was imported
before it (by the zygote, or by an earlier task), so the lines a module runs at import are
never in the data; the coverage map leaves them out of what a cell can run
(conformance/reports/coverage_map.py). Each task's lines are saved when it ends, so a rank
killed in a later task keeps what it recorded before; one killed in this task records
nothing of it, and the map calls that cell's lines unknown.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from conformance.rank import inner

_tracer: Any = None  # one coverage.Coverage per process, started on its first traced task


def traced(fn: str, kwargs: dict[str, Any], context: str, data_file: str, scope: list[str]) -> Any:
    """Run the task ``fn(**kwargs)`` with this rank's tracer in ``context``, saving into
    ``data_file.<host>.<pid>.<random>``; ``scope`` holds globs relative to the Thunder
    package's folder (``distributed/**/*.py``)."""
    tracer = _start(data_file, scope)
    tracer.switch_context(context)
    try:
        return inner.call(fn, kwargs)
    finally:
        tracer.save()  # appends this task's lines to the rank's own data file


def _start(data_file: str, scope: list[str]) -> Any:
    global _tracer
    if _tracer is None:
        import coverage
        import thunder

        root = Path(thunder.__file__).parent
        os.makedirs(os.path.dirname(data_file), exist_ok=True)
        _tracer = coverage.Coverage(
            data_file=data_file,
            data_suffix=True,  # every process of every world its own file
            include=[str(root / glob) for glob in scope],
            config_file=False,  # nobody's .coveragerc or pyproject.toml changes what is traced
        )
        _tracer.start()
    return _tracer

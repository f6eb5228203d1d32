"""Every check is shown to fail: a bug planted in Thunder inside the ranks (tests/planted_bugs.py)
makes the suite fail on exactly the cells and check areas it should, saying why.

The suite runs its smoke profile here (one cell per kind of check); expectations are
predicates over cells, so they hold for any profile.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

import pytest

from conformance.matrix.cells import Cell
from conformance.matrix.plan import expects_reset_error
from fixtures.inits import INITS
from tests.plant_plugin import ENV
from tests.suite_runs import run_suite

pytestmark = pytest.mark.slow  # starts worlds or runs the suite in a subprocess

Pred = Callable[[Cell], bool]
ALL: Pred = lambda cell: True  # noqa: E731
NONE: Pred = lambda cell: False  # noqa: E731
TIED: Pred = lambda cell: cell.tie == "tied"  # noqa: E731
REAL: Pred = lambda cell: not INITS[cell.init].on_meta  # noqa: E731
# module init that is expected to succeed (a negative cell stops at its TypeError first)
MODULE_INIT: Pred = lambda cell: cell.init == "meta_module_init" and not expects_reset_error(cell)  # noqa: E731

OFFLOADING: Pred = lambda cell: cell.offload != "none"  # noqa: E731

# bug -> {area: (must fail, may fail, words every must-fail message contains)}; areas not
# named must pass everywhere.
EXPECTED: dict[str, dict[str, tuple[Pred, Pred, str]]] = {
    "duplicate_tied_all_gather": {"collectives": (TIED, NONE, "forward all_gathers: expected")},
    "gradients_not_averaged": {"numerics": (ALL, NONE, "gradients [")},
    # Module init draws fresh weights, so a permuted shard is invisible to the values there,
    # except that the padding rows Thunder left uninitialized become weights; the state-dict
    # round trip loads through the same wrong sharding.
    "wrong_shard": {
        "materialization": (REAL, ALL, "initial parameters ["),
        "numerics": (REAL, ALL, "output [output]"),
        "state_dict": (NONE, ALL, ""),
    },
    # original_state_dict() unshards through the same broken all-gather
    "stale_forward_gather": {
        "numerics": (ALL, NONE, "output [output]"),
        "state_dict": (NONE, ALL, ""),
        "memory": (NONE, ALL, ""),  # the planted gather allocates a temporary of its own
    },
    # The bug skips the first load of a cell: materialization on meta, else the state-dict
    # round trip, which loads through the same loader.
    "one_module_not_materialized": {
        "materialization": (MODULE_INIT, NONE, "initial parameters ["),
        "numerics": (NONE, ALL, ""),
        "state_dict": (REAL, ALL, "load_original_state_dict round trip ["),
    },
    "stale_original_state_dict": {"state_dict": (ALL, NONE, "original_state_dict after training [")},
    # memory-only bugs: numerics, collectives and state dicts stay right
    "originals_kept": {"memory": (REAL, NONE, "memory held after setup")},  # meta originals hold no bytes
    # fsdp(jit(m)) runs module-init materialization on real models too: the copy shows there
    "full_model_before_sharding": {"memory": (MODULE_INIT, REAL, "setup peak under meta init")},
    # meta shards are cut from meta tensors: the copies hold no bytes there
    "shard_sources_copied": {"memory": (REAL, NONE, "setup peak under real init")},
    "intermediates_not_freed": {"memory": (ALL, NONE, "kept alive past its last use")},
    # bugs of the offloading transform, or of the Transform API it relies on
    "backward_hook_not_called": {"offload": (OFFLOADING, NONE, "never loaded in the backward")},
    "load_after_consumer": {"offload": (OFFLOADING, NONE, "reads the offloaded")},
    "policy_offloads_nothing": {"offload": (OFFLOADING, NONE, "saved tensors offloaded")},
    "offload_keeps_source": {
        "offload": (OFFLOADING, NONE, "offloaded originals were kept"),
        "memory": (NONE, OFFLOADING, ""),  # the forward's peak may hold them too
    },
}


@pytest.mark.parametrize("bug", EXPECTED)
def test_planted_bug_is_caught(bug: str, tmp_path) -> None:
    areas = EXPECTED[bug]
    # generated models have a planted test of their own (tests/test_generated.py)
    run = run_suite(tmp_path, "--profile", "smoke", "-k", "not generated", env={ENV: bug}, plant=True)
    assert run.returncode == 1, run.output
    caught = 0
    for item in run.report["cells"]:
        if item["outcome"] == "unsupported":
            continue
        cell = Cell(**item["axes"])
        must, may, words = areas.get(item["area"], (NONE, NONE, ""))
        if must(cell):
            assert item["outcome"] == "failed", f"{bug} not caught by {item['area']} on {cell.id}"
            assert words in item["message"], item["message"]
            caught += 1
        elif not may(cell):
            assert item["outcome"] == "passed", f"{bug} blamed on {item['area']} of {cell.id}:\n{item.get('message')}"
        if item["outcome"] == "failed":
            assert f"repro: python -m pytest {shlex.quote(item['id'])} --nproc 2" in item["message"]
    assert caught, f"the smoke profile has no cell where {bug} must be caught"

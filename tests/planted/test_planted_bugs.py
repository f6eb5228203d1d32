"""Every check is shown to fail: a bug planted in Thunder inside the ranks (tests/planted_bugs.py)
makes the suite fail on exactly the cells and check areas it should, saying why.

The suite runs its smoke profile here (one cell per kind of check), or, for a bug that only
a path the smoke cells do not take can show (bfloat16, ZERO3, bucketing, world sizes above
2), the ci profile's cells that take it beside some that do not. Expectations are predicates
over cells, so they hold for any profile.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

import pytest

from conformance.matrix.cells import Cell
from conformance.matrix.plan import expects_reset_error
from fixtures.inits import INITS
from tests.support.plant_plugin import ENV
from tests.support.suite_runs import probed_on_this_machine, run_suite

pytestmark = pytest.mark.slow  # starts worlds or runs the suite in a subprocess

Pred = Callable[[Cell], bool]
ALL: Pred = lambda cell: True  # noqa: E731
NONE: Pred = lambda cell: False  # noqa: E731
TIED: Pred = lambda cell: cell.tie == "tied"  # noqa: E731
REAL: Pred = lambda cell: not INITS[cell.init].on_meta  # noqa: E731
# module init that is expected to succeed (a negative cell stops at its TypeError first)
MODULE_INIT: Pred = lambda cell: cell.init == "meta_module_init" and not expects_reset_error(cell)  # noqa: E731

OFFLOADING: Pred = lambda cell: cell.offload != "none"  # noqa: E731
BF16: Pred = lambda cell: cell.dtype == "bfloat16"  # noqa: E731
ZERO3_REAL: Pred = lambda cell: cell.sharding == "zero3" and REAL(cell)  # noqa: E731
BUCKETED: Pred = lambda cell: cell.bucketing != "none"  # noqa: E731
FROZEN: Pred = lambda cell: cell.model == "lora"  # noqa: E731 (a model with frozen parameters)
INFER: Pred = lambda cell: cell.scenario == "infer"  # noqa: E731
RESHAPE: Pred = lambda cell: cell.scenario == "reshape"  # noqa: E731
ACCUMULATE: Pred = lambda cell: cell.scenario == "accumulate"  # noqa: E731
RESUME: Pred = lambda cell: cell.scenario == "resume"  # noqa: E731
DROPOUT: Pred = lambda cell: cell.model == "dropout_head"  # noqa: E731 (a dropout as its last op)
# FSDP materialized from the state dict the kit shards: Thunder loads it with load_state_dict
TRANSFORMED_SD: Pred = lambda cell: cell.init == "meta_transformed_sd" and not DDP(cell)  # noqa: E731
BUFFERED: Pred = lambda cell: cell.model == "root_owned"  # noqa: E731 (a random buffer, running statistics)
BROADCAST: Pred = lambda cell: INITS[cell.init].broadcast  # noqa: E731
DDP: Pred = lambda cell: cell.composition in ("ddp_jit", "jit_ddp")  # noqa: E731
# a bug planted in FSDP's reduce-scatter or its transform: DDP's cells never take that path
FSDP: Pred = lambda cell: not DDP(cell)  # noqa: E731
FROZEN_JIT_FSDP: Pred = lambda cell: FROZEN(cell) and cell.composition == "jit_fsdp"  # noqa: E731

# bug -> {area: (must fail, may fail, words every must-fail message contains: a string, or
# alternatives separated by " | ")}; areas not
# named must pass everywhere.
EXPECTED: dict[str, dict[str, tuple[Pred, Pred, str]]] = {
    "duplicate_tied_all_gather": {"collectives": (TIED, NONE, "forward all_gathers: expected")},
    "gradients_not_averaged": {"numerics": (ALL, NONE, "gradients at step 0")},
    # Module init draws fresh weights, so a permuted shard is invisible to the values there,
    # except that the padding rows Thunder left uninitialized become weights; the state-dict
    # round trip loads through the same wrong sharding.
    "wrong_shard": {
        "materialization": (REAL, ALL, "initial parameters ["),
        "numerics": (REAL, ALL, "output at step 0"),
        "state_dict": (NONE, ALL, ""),
    },
    # original_state_dict() unshards through the same broken all-gather
    "stale_forward_gather": {
        "numerics": (ALL, NONE, "output at step 0"),
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
    "full_model_before_sharding": {"memory": (MODULE_INIT, REAL, "setup peak")},
    # meta shards are cut from meta tensors: the copies hold no bytes there
    "shard_sources_copied": {"memory": (REAL, NONE, "setup peak")},
    "intermediates_not_freed": {"memory": (ALL, NONE, "peak: ")},
    # bugs of the offloading transform, or of the Transform API it relies on
    "backward_hook_not_called": {"offload": (OFFLOADING, NONE, "never loaded in the backward")},
    "load_after_consumer": {"offload": (OFFLOADING, NONE, "reads the offloaded")},
    "policy_offloads_nothing": {"offload": (OFFLOADING, NONE, "saved tensors offloaded")},
    "offload_keeps_source": {
        "offload": (OFFLOADING, NONE, "offloaded originals were kept"),
        "memory": (NONE, OFFLOADING, ""),  # the forward's peak may hold them too
    },
    # bugs of module init near the thresholds: only the values Thunder draws change (the
    # reference adopts them), so nothing but materialization can see them
    "module_init_draws_wider": {"materialization": (MODULE_INIT, NONE, "values outside [")},
    "shards_copied_from_rank0": {"materialization": (MODULE_INIT, NONE, "shards of ranks 0 and 1 (")},
    "small_tensor_constant": {"materialization": (MODULE_INIT, NONE, "values equal")},
    # near the thresholds, on one step, one rank, one path
    # in bfloat16 eager's own drift from the float32 twin reaches a few percent by step 4,
    # above the 1% planted here: the gradient's scale against eager's at the same weights sees it
    "gradient_off_later_step": {"numerics": (FSDP, NONE, "at step 4 (AdamW)")},
    # in bfloat16 the scale of the last rank's rows names it (the per-tensor bounds count the
    # reduction's roundings, which a 1% error of half the rows hides in)
    "gradient_off_on_last_rank": {"numerics": (FSDP, NONE, "gradients at step 0 | gradient scale at step 0")},
    "gradients_lost_later_step": {"numerics": (FSDP, NONE, "at step 2 (SGD)")},
    "bfloat16_gradients_scaled": {"numerics": (lambda c: BF16(c) and FSDP(c), NONE, "gradients at step 0")},
    "shard_copy_kept": {"memory": (ALL, NONE, "memory held after backward at step 0")},
    "tensor_leaked_per_step": {"memory": (ALL, NONE, "memory held after backward at step 0")},
    "zero3_originals_kept": {"memory": (ZERO3_REAL, NONE, "memory held after setup")},
    "bucketed_gradients_not_averaged": {"numerics": (lambda c: BUCKETED(c) and FSDP(c), NONE, "gradients at step 0")},
    # a shard one row too long (only where the world divides dim 0: some parameter of every
    # model at 2 ranks) cannot be gathered as held: the numerics area names its shape, where
    # the kit's gather once asserted (a kit error hiding every area of the cell); the other
    # areas see the extra row's bytes, NaN or a failed load
    "padding_when_divisible": {
        "numerics": (FSDP, NONE, "not gathered as Thunder held it: rank 0: shape ( | did not run"),
        **{area: (NONE, FSDP, "") for area in ("materialization", "collectives", "memory", "state_dict", "offload")},
    },
    # a frozen base made trainable: named by materialization (requires_grad), numerics (a
    # gradient eager does not have) and collectives (reduce-scatters for it); the training it
    # then does moves memory and the state dict too. Under jit_fsdp Thunder's own prologue
    # refuses the changed flag at the first call (a failure of every area: did not run)
    "frozen_parameters_trained": {
        "materialization": (FROZEN, NONE, "trainable parameters: requires_grad differs from eager's | did not run"),
        "numerics": (FROZEN, NONE, "present where eager has none | did not run"),
        "collectives": (FROZEN, NONE, "backward reduce_scatters: expected | did not run"),
        "memory": (NONE, FROZEN, ""),
        "state_dict": (NONE, FROZEN, ""),
        "offload": (NONE, FROZEN_JIT_FSDP, ""),
    },
    # inference after training: the result of a forward under no_grad asks for a gradient
    "no_grad_ignored": {"numerics": (INFER, NONE, "output under no_grad needs no gradient")},
    # only the computation compiled for the second input shape is wrong: training conforms
    "second_shape_gradients_not_averaged": {
        "numerics": (lambda c: RESHAPE(c) and FSDP(c), NONE, "gradients at the second input shape [")
    },
    # the pin loses the skipped micro-steps' gradients (an xfails entry names exactly that);
    # with the sync never resumed the last micro-step's are lost too: a failure the entry
    # does not explain
    "no_sync_never_ends": {"numerics": (ACCUMULATE, NONE, "gradients accumulated over 2 micro-steps [")},
    # replicated buffers that differ from rank to rank: only a model with a random buffer shows
    # it; the ranks then train different functions, which numerics may see too
    "buffers_not_broadcast": {
        "materialization": (lambda c: BROADCAST(c) and BUFFERED(c), NONE, "buffers on every rank"),
        "numerics": (NONE, lambda c: BROADCAST(c) and BUFFERED(c), ""),
    },
    # running statistics never updated: only a model whose forward updates a buffer shows it
    "buffer_updates_dropped": {
        "numerics": (BUFFERED, NONE, "buffers at step 0 (SGD) [norm.running_"),
        # the planted forward's own copies of the buffers are alive during the forward
        "memory": (NONE, BUFFERED, ""),
    },
    # the sum of the ranks' gradients where DDP must average: every DDP cell's numerics (an
    # accumulated gradient too); FSDP's cells conform
    "ddp_gradients_not_averaged": {"numerics": (DDP, NONE, "gradients at step 0 (SGD) [")},
    # a checkpoint loaded through load_state_dict (FSDP's sharded one, DDP's whole one) that
    # loses the buffers: only where a buffer changed since init (running statistics)
    # (and a materialization from the sharded state dict the kit hands over, where buffers are)
    "load_drops_buffers": {
        "state_dict": (lambda c: RESUME(c) and BUFFERED(c), NONE, "checkpoint resumed: buffers after loading"),
        "materialization": (NONE, lambda c: TRANSFORMED_SD(c) and BUFFERED(c), ""),
        "numerics": (NONE, lambda c: TRANSFORMED_SD(c) and BUFFERED(c), ""),
    },
    # ... that loses the last rank's shards: every resumed cell, on that rank; and every cell
    # materialized from a sharded state dict starts from what that rank's shards held before
    "load_loses_last_rank": {
        "state_dict": (RESUME, TRANSFORMED_SD, "checkpoint resumed: weights after loading"),
        "materialization": (TRANSFORMED_SD, NONE, "initial parameters ["),
        "numerics": (NONE, TRANSFORMED_SD, ""),
        "collectives": (NONE, TRANSFORMED_SD, ""),
        "memory": (NONE, TRANSFORMED_SD, ""),
    },
    # masks the eager models replay: outputs and gradients agree, only the masks' statistics fail
    "dropout_mask_frozen": {"numerics": (DROPOUT, NONE, "dropout mask at step 1")},
    "dropout_drops_half": {"numerics": (DROPOUT, NONE, "dropout fraction dropped")},
    "module_init_draws_per_rank": {
        "materialization": (lambda c: MODULE_INIT(c) and BUFFERED(c), NONE, "buffers on every rank"),
        "numerics": (NONE, lambda c: MODULE_INIT(c) and BUFFERED(c), ""),
    },
}

# bug -> the cells it runs on instead of the smoke profile (ci's, else nightly's): the first
# ones that take its path, and the first ones that do not (which must pass)
ON_CI: dict[str, tuple[Pred, ...]] = {
    # FSDP's reduce-scatter: a DDP cell of the same kind must pass
    "gradient_off_later_step": (lambda c: BF16(c) and FSDP(c), lambda c: not BF16(c) and FSDP(c), DDP),
    "gradient_off_on_last_rank": (lambda c: c.world_size > 2 and FSDP(c), lambda c: c.world_size == 2 and FSDP(c)),
    "gradients_lost_later_step": (lambda c: BF16(c) and FSDP(c), lambda c: not BF16(c) and FSDP(c), DDP),
    "bfloat16_gradients_scaled": (lambda c: BF16(c) and FSDP(c), lambda c: not BF16(c), lambda c: BF16(c) and DDP(c)),
    "shard_copy_kept": (BF16, lambda c: c.world_size > 2),
    "tensor_leaked_per_step": (lambda c: c.sharding == "zero3", lambda c: c.offload != "none"),
    "zero3_originals_kept": (ZERO3_REAL, lambda c: REAL(c) and c.sharding == "zero2"),
    "bucketed_gradients_not_averaged": (
        lambda c: BUCKETED(c) and FSDP(c),
        lambda c: not BUCKETED(c),
        lambda c: BUCKETED(c) and DDP(c),
    ),
    "no_grad_ignored": (INFER, lambda c: not INFER(c)),
    "padding_when_divisible": (lambda c: REAL(c) and FSDP(c) and c.world_size == 2, DDP),
    "second_shape_gradients_not_averaged": (
        lambda c: RESHAPE(c) and FSDP(c),
        lambda c: not RESHAPE(c),
        lambda c: RESHAPE(c) and DDP(c),
    ),
    "no_sync_never_ends": (ACCUMULATE, lambda c: not ACCUMULATE(c)),
    "buffer_updates_dropped": (BUFFERED, lambda c: not BUFFERED(c) and c.model.startswith("litgpt")),
    "ddp_gradients_not_averaged": (DDP, lambda c: DDP(c) and c.scenario == "accumulate", lambda c: not DDP(c)),
    "buffers_not_broadcast": (
        lambda c: BROADCAST(c) and BUFFERED(c),
        lambda c: BROADCAST(c) and not BUFFERED(c),
    ),
    "module_init_draws_per_rank": (
        lambda c: MODULE_INIT(c) and BUFFERED(c),
        lambda c: MODULE_INIT(c) and not BUFFERED(c),
    ),
    "load_drops_buffers": (
        lambda c: RESUME(c) and BUFFERED(c) and not DDP(c),
        lambda c: RESUME(c) and DDP(c),
        lambda c: RESUME(c) and not BUFFERED(c),
    ),
    "load_loses_last_rank": (
        lambda c: RESUME(c) and not DDP(c),
        lambda c: RESUME(c) and DDP(c),
        TRANSFORMED_SD,
        lambda c: ACCUMULATE(c) and not TRANSFORMED_SD(c),
    ),
    "dropout_mask_frozen": (DROPOUT, lambda c: DROPOUT(c) and BF16(c), lambda c: c.model == "mlp"),
    "dropout_drops_half": (DROPOUT, lambda c: DROPOUT(c) and c.composition == "jit_fsdp", lambda c: c.model == "mlp"),
    "frozen_parameters_trained": (
        lambda c: FROZEN(c) and c.composition == "fsdp_jit",
        FROZEN_JIT_FSDP,
        lambda c: c.model == "mlp",
    ),
}


def _selection(bug: str) -> list[str]:
    """The suite's arguments for the cells ``bug`` runs on."""
    if bug not in ON_CI:
        return ["--profile", "smoke", "-k", "not generated"]
    from conformance.matrix.profiles import cells

    # on the pin, the probed compositions and executors are the unsupported ones; small models
    # first; ci's cells where it has each kind wanted (a pairwise array need not hold every
    # triple: root_owned's resume may be DDP's alone), else nightly's
    probed = probed_on_this_machine()
    for profile in ("ci", "nightly"):
        running = [c for c in cells(profile, 2, probed) if c.composition not in probed and c.executors not in probed]
        running.sort(key=lambda c: c.model.startswith("litgpt"))
        chosen = [next((c for c in running if wanted(c)), None) for wanted in ON_CI[bug]]
        if all(chosen):
            return ["--profile", profile, "-k", " or ".join(c.id for c in chosen)]
    raise AssertionError(f"no profile holds a cell of each kind {bug} is tried on")


@pytest.mark.parametrize("bug", EXPECTED)
def test_planted_bug_is_caught(bug: str, tmp_path) -> None:
    areas = EXPECTED[bug]
    # generated models have a planted test of their own (tests/test_generated.py)
    run = run_suite(tmp_path, *_selection(bug), env={ENV: bug}, plant=True)
    assert run.returncode == 1, run.output
    caught = 0
    for item in run.report["cells"]:
        if item["outcome"] == "unsupported":
            continue
        cell = Cell(**item["axes"])
        must, may, words = areas.get(item["area"], (NONE, NONE, ""))
        if must(cell):
            assert item["outcome"] == "failed", f"{bug} not caught by {item['area']} on {cell.id}"
            assert any(w in item["message"] for w in words.split(" | ")), item["message"]
            caught += 1
        elif not may(cell):
            # a known non-conformance of the pin (xfails file) stays what it was
            assert item["outcome"] in ("passed", "xfailed"), (
                f"{bug} blamed on {item['area']} of {cell.id}:\n{item.get('message')}"
            )
        if item["outcome"] == "failed":
            assert f"repro: python -m pytest {shlex.quote(item['id'])} --nproc 2" in item["message"]
    assert caught, f"no cell selected where {bug} must be caught"

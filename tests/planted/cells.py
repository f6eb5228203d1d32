"""Predicates over cells that planted bugs' expectations and cell choices are written in, so
that a prediction holds for any profile."""

from __future__ import annotations

from collections.abc import Callable

from conformance.matrix.cells import DEFAULT_CHECKPOINTING, Cell
from conformance.matrix.features import features
from conformance.matrix.initialization import expects_reset_error
from fixtures.compositions import COMPOSITIONS
from fixtures.inits import INITS
from fixtures.models import fixture_for

Pred = Callable[[Cell], bool]
ALL: Pred = lambda cell: True  # noqa: E731
NONE: Pred = lambda cell: False  # noqa: E731
TIED: Pred = lambda cell: cell.tie == "tied"  # noqa: E731
REAL: Pred = lambda cell: not INITS[cell.init].on_meta  # noqa: E731
# a negative cell: Thunder must refuse the model (its module init raises first)
NEGATIVE: Pred = expects_reset_error
# module init that is expected to succeed (a negative cell stops at its TypeError first)
MODULE_INIT: Pred = lambda cell: cell.init == "meta_module_init" and not expects_reset_error(cell)  # noqa: E731

# the model real but for a fine-tune's fresh part, on meta: Thunder draws that part only
PARTLY_META: Pred = lambda cell: INITS[cell.init].partly_meta  # noqa: E731

OFFLOADING: Pred = lambda cell: cell.offload != "none"  # noqa: E731
# every block through torch.utils.checkpoint (fixtures/checkpointing.py)
CHECKPOINTED: Pred = lambda cell: cell.checkpointing != DEFAULT_CHECKPOINTING  # noqa: E731
BF16: Pred = lambda cell: cell.dtype == "bfloat16"  # noqa: E731
ZERO3_REAL: Pred = lambda cell: cell.sharding == "zero3" and REAL(cell)  # noqa: E731
BUCKETED: Pred = lambda cell: cell.bucketing != "none"  # noqa: E731
INFER: Pred = lambda cell: cell.scenario == "infer"  # noqa: E731
RESHAPE: Pred = lambda cell: cell.scenario == "reshape"  # noqa: E731
ACCUMULATE: Pred = lambda cell: cell.scenario == "accumulate"  # noqa: E731
RESUME: Pred = lambda cell: cell.scenario == "resume"  # noqa: E731
# a dropout as its last op (the eager models replay its mask)
DROPOUT: Pred = lambda cell: fixture_for(cell.model, cell.spec).output_dropout is not None  # noqa: E731
BROADCAST: Pred = lambda cell: INITS[cell.init].broadcast  # noqa: E731
# Thunder's own transforms (its plugins API's included), never PyTorch's parallelism under
# Thunder: a bug planted in Thunder's DDP or FSDP transform reaches only these
THUNDERS: Pred = lambda cell: COMPOSITIONS[cell.composition].parallelism == "thunder"  # noqa: E731
DDP: Pred = lambda cell: THUNDERS(cell) and COMPOSITIONS[cell.composition].replicated  # noqa: E731
# a bug planted in FSDP's reduce-scatter or its transform: DDP's cells never take that path
FSDP: Pred = lambda cell: THUNDERS(cell) and not COMPOSITIONS[cell.composition].replicated  # noqa: E731
# the gradients' reduction in bfloat16: a reduction upcast there moves other bytes in another dtype
BF16_FSDP: Pred = lambda cell: BF16(cell) and FSDP(cell)  # noqa: E731
BF16_DDP: Pred = lambda cell: BF16(cell) and DDP(cell)  # noqa: E731
# FSDP materialized from the state dict the kit shards: Thunder loads it with load_state_dict
TRANSFORMED_SD: Pred = lambda cell: cell.init == "meta_transformed_sd" and not DDP(cell)  # noqa: E731
ZERO3_FSDP: Pred = lambda cell: cell.sharding == "zero3" and FSDP(cell)  # noqa: E731


def has(feature: str) -> Pred:
    """The cell's model has ``feature``, as conformance/matrix/features.py derives it from the
    built module (the same derivation ci's coverage contract is written in)."""
    return lambda cell: feature in features(cell.model, cell.tie, cell.world_size, cell.spec)


# in its state dict (a rotary cache is not)
PERSISTENT_BUFFER: Pred = has("persistent_buffer")
# changed by a training forward (running statistics)
TRAINED_BUFFER: Pred = has("trained_buffer")
# a persistent buffer drawn at random at init
RANDOM_BUFFER: Pred = has("random_buffer")
FROZEN: Pred = has("frozen")  # a parameter with requires_grad=False
ROOT_OWNED: Pred = has("root_owned")  # a parameter or persistent buffer with no dot in its name
FROZEN_JIT_FSDP: Pred = lambda cell: FROZEN(cell) and cell.composition == "jit_fsdp"  # noqa: E731

"""What a check derived for one failure, by name: the numbers (from the model, eager PyTorch
and the world size, never from Thunder) that the failure's message prints beside what
Thunder did. An xfails template names them (``expected {expected}, got {unbucketed}``), so
that an entry excuses a message only where its numbers are the ones the kit derived for that
cell (conformance/frontend/xfails.py). Each check records them with ``Findings.expect(...,
derived=...)``; the names are fixed here so that a template naming another is refused when
the xfails file loads."""

from __future__ import annotations

DERIVED: dict[str, str] = {
    # collectives (checks/collectives.py): counts per phase and kind, and bytes
    "expected": "the count (or bytes) the cell's model implies",
    "unbucketed": "the count the cell would expect without bucketing (one bucket per parameter storage)",
    "zero2": "the count the cell would expect under ZERO2 (no backward re-gather)",
    "expected_times_world_size": "the expected bytes, world-size times",
    # memory (checks/memory/__init__.py): what is held after setup
    "resident": "the bytes of the rank's shards and buffers",
    "buffers": "the bytes of the model's buffers",
    "handed_over": "the bytes of the state dict the kit handed Thunder",
    "resident_and_handed_over": "resident + handed_over",
    "resident_and_buffers": "resident + buffers",
    "unsharded": "the bytes of every parameter unsharded, dim 0 padded to the world size",
    "resident_and_unsharded": "resident + unsharded",
    # memory: what is held after a backward or a step
    "expected_and_twice_unsharded": "the bytes the model implies + 2 x unsharded (parameters, gradients kept beside)",
    "expected_and_activations": "the bytes the model implies + twice eager's forward peak (a forward's activations)",
    "bound_from_eager": "under checkpointing, twice what eager's checkpointed model keeps alive after its forward",
    # compiled (checks/compiled.py): under tensor parallelism
    "planned": "the calls of the Linears the plan parallelizes in one forward of eager's whole model",
    # numerics (checks/numerics/tolerances.py, propagation.py), as the message prints them (3 digits)
    "twin_size": "the 2-norm of the float32 twin's tensor (or update)",
    "eager_distance": "eager's distance from the float32 twin",
    "rounding": "the dtype's rounding of the twin's update",
    "optimizer_allowance": "what the optimizer makes of gradients off as far as eager's",
    "bound": "the distance the check allows",
}


def printed(value: float) -> float:
    """``value`` as a message prints it with ``:.3g``, so that a template's ``{bound}`` equals
    the number the message shows."""
    return float(f"{value:.3g}")

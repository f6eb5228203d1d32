"""Margins that memory bounds allow, shared by the areas that bound bytes."""

import torch

from conformance.checks.storages import allocated_bytes


# calibrated on a measurement: held after the forward minus the data flow, -8 to 0 B over ci's 75 cells on the pin
# and 0.2.6 (2026-11-26): docs/measurements.md#setup-under-meta-init-zero3-in-memory-2026-11-26
def held_slack(device: torch.device | str) -> int:
    """What a rank may hold after the forward beyond its trace's data flow. On the CPU
    nothing: the tracker sees every storage the forward allocates, and the data flow follows
    views, so the two agree to the byte (the pin's ci: measured minus data flow -8 to 0 B
    over 75 cells). On CUDA one allocator block, for 0-d scalars the runtime makes outside
    the trace (the allocator's statistics count each as a block)."""
    return 0 if torch.device(device).type == "cpu" else allocated_bytes(1, device)


# how far a CUDA setup peak may exceed the kit's estimate of it under FSDP's real init (the
# caching allocator can serve a tensor from a larger cached block); on CPU the bound is exact
ESTIMATE_FACTOR = 1.25

"""Bugs in what DDP's transform does while it sets the replicas up."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from conformance.checks.registry import AREAS
from tests.planted.cells import DDP, FSDP, NONE
from tests.planted.record import Expect, planted


# Torch raises inside Thunder's broadcast while the setup is measured, through the kit's
# dispatch mode: every area of every DDP cell fails as Thunder's failure, naming Thunder's frame
# ("did not run to completion: Thunder raised at ...ddp_v2.py:N in transform_module"), never
# as the kit's error
@planted(
    {area: Expect(DDP, NONE, "Thunder raised at") for area in AREAS},
    cells=(lambda c: c.composition == "ddp_jit", lambda c: c.composition == "jit_ddp", FSDP),
)
@contextlib.contextmanager
def ddp_broadcast_from_missing_rank() -> Iterator[None]:
    """DDP's transform broadcasts the replicas from a rank the world does not have (one past
    the last): torch refuses the root inside Thunder's ``transform_module``."""
    from thunder.distributed.transforms.ddp_v2 import DDPTransform

    original = DDPTransform.transform_module

    def transform_module(self: Any, model: Any) -> Any:
        self.broadcast_from = self.process_group.size()
        return original(self, model)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DDPTransform, "transform_module", transform_module)
        yield

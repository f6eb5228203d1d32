"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from conformance.world import launch
from tests.support.fake_gpus import FakeCuda


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """``gpus(n, mask=..., error=...)``: the pytest process sees ``n`` GPUs through ``mask``
    (None: CUDA_VISIBLE_DEVICES unset) and, with ``error``, a driver too old to use them."""

    def see(n: int, mask: str | None = None, error: str | None = None) -> launch.Cuda:
        if mask is None:
            monkeypatch.delenv(launch.MASK, raising=False)
        else:
            monkeypatch.setenv(launch.MASK, mask)
        found = launch.inspect_cuda(FakeCuda(n, error))
        monkeypatch.setattr(launch, "cuda", lambda: found)
        return found

    return see


@pytest.fixture
def world_of_one(tmp_path) -> Iterator[None]:
    """One gloo rank in this process for the test, gone after it."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()

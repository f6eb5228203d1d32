"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest

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

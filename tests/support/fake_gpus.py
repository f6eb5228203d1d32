"""pytest plugin for the kit's own tests: ``-p tests.support.fake_gpus`` with CONFORMANCE_FAKE_GPUS=N
makes the pytest process see N visible GPUs, so that the checks of ``--backend nccl``,
``--nproc gpus`` and ``--min-gpus`` against the visible devices run on a machine without any;
with CONFORMANCE_FAKE_CUDA_ERROR=MESSAGE besides, ``torch.cuda.init()`` raises that message as
a driver too old for the build would. (No world may start under it: the ranks would look for
GPUs that are not there.)

``FakeCuda`` is the stand-in for ``torch.cuda``; tests in process hand it to
``launch.inspect_cuda`` themselves."""

from __future__ import annotations

import os
import warnings

import pytest

from conformance.world import launch

ENV = "CONFORMANCE_FAKE_GPUS"
ERROR_ENV = "CONFORMANCE_FAKE_CUDA_ERROR"
TOO_OLD = "The NVIDIA driver on your system is too old (found version 11040)"


class FakeCuda:
    """What ``torch.cuda`` answers on a machine with ``devices`` GPUs: NVML counts them (so
    ``device_count`` does even where the build cannot use them). With an ``error`` (a driver
    too old for the build), ``init`` raises it; with ``available=False`` besides,
    ``is_available`` already says False and warns it, as torch's cudaGetDeviceCount check does
    (``init`` raises only where ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` let that pass)."""

    def __init__(self, devices: int, error: str | None = None, available: bool = True) -> None:
        self.devices, self.error, self.available = devices, error, available
        self.initialized = False

    def device_count(self) -> int:
        return self.devices

    def is_available(self) -> bool:
        if not self.available and self.error is not None:
            warnings.warn(f"CUDA initialization: {self.error} (Triggered internally at cuda.cpp:1)", stacklevel=2)
        return self.available and self.devices > 0

    def init(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"{self.error}\nPlease update your GPU driver.")
        self.initialized = True


# first: the kit's own pytest_configure (registered later, from conftest.py) reads the GPUs
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    fake = launch.inspect_cuda(FakeCuda(int(os.environ[ENV]), os.environ.get(ERROR_ENV)))
    # every reader asks launch.cuda() through the module, so this is all they see
    launch.cuda = lambda: fake

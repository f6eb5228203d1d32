"""pytest plugin for the kit's own tests: ``-p tests.fake_gpus`` with CONFORMANCE_FAKE_GPUS=N
makes the pytest process see N visible GPUs, so that the checks of ``--backend nccl`` against
the visible devices run on a machine without any. (No world may start under it: the ranks
would look for GPUs that are not there.)"""

from __future__ import annotations

import os

from conformance.world import launch

ENV = "CONFORMANCE_FAKE_GPUS"

# patched where every reader looks it up: conformance.frontend.options calls it through the
# module, and the resolvers in launch read their module's global
launch.visible_cuda_devices = lambda: int(os.environ[ENV])

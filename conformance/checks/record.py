"""The record of one cell's run on one rank: what the rank side measured and kept, and all
that a check area may read. The rank fills it once; every area inspects the same record.

Full parameters and gradients are gathered from every rank's shard by the kit itself
(plain ``torch.distributed``), independent of Thunder's own state-dict code; every tensor
here is a detached CPU copy unless it says otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from conformance.matrix.cells import Cell
from fixtures import inits

Tensors = dict[str, torch.Tensor]


@dataclasses.dataclass
class SetupRecord:
    """Right after setup, before the first step."""

    placement: dict[str, str]  # device of every parameter and buffer of the Thunder module
    initial: Tensors  # full parameters, gathered from the shards
    reference_initial: Tensors  # the eager reference's parameters
    buffers: Tensors  # the Thunder module's buffers
    reference_buffers: Tensors


@dataclasses.dataclass
class StepRecord:
    """The first training step: this rank's output and the full gradients."""

    output: torch.Tensor  # this rank's output from the Thunder module
    reference_output: torch.Tensor  # eager output on the same input
    grads: Tensors  # full (unsharded) gradients gathered from every rank's shard
    reference_grads: Tensors
    golden_output: torch.Tensor | None = None  # float32 twin of the reference (low-precision cells)
    golden_grads: Tensors | None = None


@dataclasses.dataclass
class ParametersAfter:
    """Full parameters once the steps of one optimizer are done."""

    thunder: Tensors  # gathered from the shards
    reference: Tensors  # the eager reference, trained on every rank's batch
    golden: Tensors | None = None  # the float32 twin (low-precision cells)


@dataclasses.dataclass
class StateDictRecord:
    """``original_state_dict()`` after training, then a ``load_original_state_dict()`` round trip."""

    original: Tensors  # tm.original_state_dict() after training
    reference: Tensors  # the eager reference's state dict at the same point
    loaded: Tensors  # what was handed to load_original_state_dict (the initial parameters)
    reloaded: Tensors  # full parameters after loading, gathered from the shards


@dataclasses.dataclass(frozen=True)
class SavedTensor:
    """One tensor the Thunder module's autograd node saved for backward, as found after the
    measured step's forward."""

    offloaded: bool  # in a storage the reference offloading transform created
    device: str
    nbytes: int


@dataclasses.dataclass
class MemoryRecord:
    """Bytes on the rank's device. Peaks are of what a phase allocated while it ran (setup,
    and the forward, backward and optimizer step of the measured step)."""

    peaks: dict[str, int]  # phase -> peak bytes allocated during it
    eager_peaks: dict[str, int]  # setup, forward and backward of the eager model on this rank's input
    alive_after_setup: int  # every live storage right after setup, less the kit's own tensors
    alive_after_forward: int  # what the measured forward allocated and left alive at its end
    saved: list[SavedTensor | None] | None  # held by the autograd node between forward and backward


@dataclasses.dataclass
class CellRecord:
    cell: Cell
    rank: int
    device: torch.device
    dtype: torch.dtype
    backend: str
    reference: nn.Module  # eager single-process model, stepped alongside
    thunder_module: Any  # live, for its final traces
    setup: SetupRecord
    first_step: StepRecord
    after: dict[str, ParametersAfter]  # optimizer name -> parameters after its steps, in order
    state_dict: StateDictRecord
    memory: MemoryRecord
    timings: dict[str, float]

    @property
    def init(self) -> inits.InitMode:
        return inits.INITS[self.cell.init]

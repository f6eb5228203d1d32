"""What the ``resume`` scenario records of its checkpoints (conformance/rank/scenarios/resume.py
and rank0_only.py), on one rank: each round trip beside the uninterrupted run, and the full
checkpoint taken and loaded on rank 0 alone. The state_dict area judges them."""

from __future__ import annotations

import dataclasses

import torch

Tensors = dict[str, torch.Tensor]


# the call that takes a checkpoint under Thunder's own distributed transforms
THUNDER_TAKEN_BY = "thunder.distributed.checkpoint.get_model_state_dict"


@dataclasses.dataclass
class Compared:
    """One moment of a resumed run beside the uninterrupted one: what each held then."""

    what: str  # e.g. "gradients at resumed step 1"
    resumed: Tensors
    uninterrupted: Tensors


@dataclasses.dataclass
class Resumed:
    """One checkpoint round trip of the ``resume`` scenario (conformance/rank/scenarios/resume.py):
    the checkpoint taken after training, what it must hold (the kit's own gathering: eager's
    names for a full one, this rank's shards for a sharded one), and the module it was loaded
    into stepped beside the uninterrupted one."""

    kind: str  # "full" or "sharded"
    taken: Tensors  # the checkpoint as Thunder gave it (local tensors of DTensors)
    truth: Tensors  # what it must hold, gathered by the kit at the same moment
    # what ``taken_by`` raised taking it (under Thunder's API the module's own state dict stood in)
    api_error: str | None = None
    # whose code raised it (conformance/rank/raised.py: origin): the pin's raise on a gloo world
    # is torch's (a CUDA mesh), one Thunder's own code makes is another
    api_origin: str | None = None
    # the call that takes it: Thunder's checkpoint API, or torch.distributed.checkpoint's under
    # PyTorch's parallelism (conformance/rank/scenarios/resume_dcp.py)
    taken_by: str = THUNDER_TAKEN_BY
    compared: list[Compared] = dataclasses.field(default_factory=list)
    error: str | None = None  # what Thunder raised saving, loading or resuming (compared ends there)


@dataclasses.dataclass
class RankZeroOnly:
    """The full checkpoint taken and loaded with ``rank0_only=True`` (the ``resume`` scenario,
    conformance/rank/scenarios/rank0_only.py), on one rank."""

    rank: int
    truth: Tensors  # what the whole checkpoint must hold (the kit's gathering, eager's names)
    checkpoint: Tensors  # what this rank's module holds once the checkpoint is loaded into it
    taken: Tensors | None = None  # what this rank took (None: get_model_state_dict raised)
    take_error: str | None = None  # what get_model_state_dict raised taking it (``Kind: message``)
    take_origin: str | None = None  # whose code raised it (conformance/rank/raised.py: origin)
    untouched: Tensors = dataclasses.field(default_factory=dict)  # a fresh module's, before loading
    loaded: Tensors = dataclasses.field(default_factory=dict)  # the same module's after loading
    error: str | None = None  # what Thunder raised composing or loading

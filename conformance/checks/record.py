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

from conformance.checks.checkpoint_record import RankZeroOnly, Resumed
from conformance.checks.traces import FinalTraces
from conformance.matrix.cells import Cell
from fixtures import inits

Tensors = dict[str, torch.Tensor]
MEASURED_STEP = 1  # the step whose memory is measured: the first compiles, the second shows the steady state


@dataclasses.dataclass
class SetupRecord:
    """Right after setup, before the first step."""

    placement: dict[str, str]  # device of every parameter and buffer of the Thunder module
    initial: Tensors  # full parameters, gathered from the shards
    eager_initial: Tensors  # the eager model's parameters
    buffers: Tensors  # the Thunder module's buffers
    eager_buffers: Tensors  # the eager model's, as built (before it adopts any of Thunder's)
    # buffers whose value on this rank differs from rank 0's (a buffer is replicated, never
    # sharded: every rank must compute with the same one)
    buffers_unlike_rank0: list[str] = dataclasses.field(default_factory=list)
    # under PyTorch's parallelism, what DCP's load of the full state dict raised at setup
    # (``Kind at file:line in function: message``); the model then starts where it was left
    loaded_error: str | None = None
    # asynchronous collectives Thunder's setup issued through torch.distributed and never
    # waited on (conformance/rank/waits.py), each "phase: call"
    unwaited: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ParametersAfter:
    """Full parameters after an optimizer step."""

    thunder: Tensors  # gathered from the shards
    eager_model: Tensors  # the eager model, trained on every rank's batch
    twin: Tensors | None = None  # the float32 twin (low-precision cells)


@dataclasses.dataclass
class RankGradients:
    """Eager's gradients of each rank's own loss, computed in the cell's dtype at given weights:
    what data-parallel ranks hand their reduction. Per name, in float64: their mean (exact)
    and the mean of their magnitudes (what bounds the reduction's own roundings)."""

    mean: Tensors
    magnitude: Tensors


@dataclasses.dataclass(frozen=True)
class Apart:
    """A replica's tensor on one rank whose bits are not rank 0's."""

    rank: int
    elements: int  # how many elements differ, bit for bit
    largest: float  # the largest absolute difference among them (NaN where either side is)


@dataclasses.dataclass
class Replicas:
    """Under DDP, after one step: per name, every rank whose replica differs from rank 0's
    bit for bit (the same averaged gradients and the same optimizer leave them identical).
    Every rank records every rank's, so their findings read alike."""

    gradients: dict[str, list[Apart]]
    parameters: dict[str, list[Apart]]


@dataclasses.dataclass
class ReferenceStep:
    """A reference's side of one training step (conformance/rank/references.py: how each is
    built and what the checks compare it with): this rank's output and the full gradients of
    the ranks' averaged loss."""

    output: torch.Tensor  # this rank's output
    grads: Tensors  # by parameter name (one per tied group); frozen parameters have none


@dataclasses.dataclass
class TrainedStep(ReferenceStep):
    """The side of a reference that trains in lockstep with the Thunder module (eager PyTorch,
    the float32 twin): also its buffers after the step."""

    # what its forwards made of this rank's micro-batches alone (a buffer the forward updates,
    # such as running statistics, is per rank)
    buffers: Tensors = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Issued:
    """One collective a rank issued at the process group (conformance/rank/process_group.py)."""

    phase: str  # forward, backward or optimizer step
    kind: str  # all_gather, reduce_scatter, all_reduce, broadcast or all_to_all
    dtype: str
    nbytes: int  # the whole buffer: all-gathered into, reduce-scattered from, all-reduced


@dataclasses.dataclass
class StepRecord:
    """One training step: this rank's output, the full gradients, the parameters after it, and
    each reference's side of the same step (conformance/rank/references.py)."""

    optimizer: str  # which optimizer took the step
    output: torch.Tensor  # this rank's output from the Thunder module
    grads: Tensors  # full (unsharded) gradients gathered from every rank's shard
    eager: TrainedStep  # eager PyTorch on the same global batch
    after: ParametersAfter
    twin: TrainedStep | None = None  # float32 twin of the eager model (low-precision cells)
    # the float32 twin at the weights the Thunder module held as the step began (low-precision
    # cells): less the twin's own, what the parameters' allowed drift makes of this step's
    twin_at_thunder: ReferenceStep | None = None
    # eager's gradients of each rank's own loss at those weights, in the cell's dtype (what
    # the reduction is handed)
    local_at_thunder: RankGradients | None = None
    # float32 cells: eager in float64 at those weights (what the twin at them is below
    # float32): against it, what float32's roundings did to eager's own gradients
    float64_at_thunder: ReferenceStep | None = None
    buffers: Tensors = dataclasses.field(default_factory=dict)  # this rank's Thunder module's, after the step
    # every rank's dropout mask (kept: True), where the model's last op is a dropout
    dropout_masks: list[torch.Tensor] | None = None
    replicas: Replicas | None = None  # DDP only: where the ranks' replicas came apart
    # the backward trace Thunder ran for this step (``thunder.last_backward_traces``): the
    # collectives area judges what every step's backward reduced, not only the last's
    backward_trace: Any = None
    # under PyTorch's parallelism, the collectives issued at the process group while the Thunder
    # module's forward, backward and optimizer step ran, in order (None: not counted, Thunder's
    # own transforms, whose collectives are their traces')
    issued: list[Issued] | None = None


# the calls a cell takes and loads a full state dict with: Thunder's own, or under PyTorch's
# parallelism torch.distributed.checkpoint's (full_state_dict=True)
THUNDER_API = ("original_state_dict", "load_original_state_dict")
DCP_API = ("get_model_state_dict", "set_model_state_dict")


@dataclasses.dataclass
class StateDictRecord:
    """A full state dict taken after training (``original_state_dict()``; under PyTorch's
    parallelism DCP's ``get_model_state_dict``), then a round trip loading one
    (``load_original_state_dict()``; ``set_model_state_dict``)."""

    original: Tensors  # the state dict taken after training
    buffers: Tensors  # the Thunder module's buffers at that point, read by the kit
    eager_model: Tensors  # the eager model's state dict at the same point
    loaded: Tensors  # what was handed to load_original_state_dict (the initial parameters)
    reloaded: Tensors  # full parameters after loading, gathered from the shards
    # full parameters gathered by the kit when original_state_dict() was taken: a scenario
    # (``resume``) may have stepped the module on since the training's last step
    gathered: Tensors = dataclasses.field(default_factory=dict)
    # the persistent buffers handed to load_original_state_dict with the parameters: known
    # values no module held before (drawn by the kit), and this rank's buffers after loading
    loaded_buffers: Tensors = dataclasses.field(default_factory=dict)
    reloaded_buffers: Tensors = dataclasses.field(default_factory=dict)
    api: tuple[str, str] = THUNDER_API  # the calls that took and loaded it, as findings name them
    # what taking or loading raised ("Kind at file:line in function: message"): nothing to compare
    taken_error: str | None = None
    loaded_error: str | None = None


@dataclasses.dataclass(frozen=True)
class SavedTensor:
    """One tensor the Thunder module's autograd node saved for backward, as found after the
    measured step's forward."""

    offloaded: bool  # in a storage the reference offloading transform created
    device: str
    nbytes: int


@dataclasses.dataclass
class ForwardHeld:
    """What the measured forward allocated and left alive, storage by storage, and what holds
    it (``conformance/rank/held.py``): on the CPU, for PyTorch's parallelism's cells, where no
    single trace states what a forward keeps."""

    alive: int  # bytes of the storages the forward allocated and left alive
    # ... of those that the output's autograd graph (the output, every tensor a node saved for
    # the backward) or the model's registered parameters hold
    graph: int
    unheld: list[int]  # the bytes of each storage alive that neither holds
    # parameter -> bytes of the storages the forward allocated that hold its values (or its
    # transpose, in its dtype or float32): copies of it, its own registered storage aside
    copies: dict[str, int]
    # ... as eager PyTorch's own forward of the unsharded model on the same input leaves them
    eager_copies: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ModuleInit:
    """Eager PyTorch initializing one module's own tensors as Thunder's materialization does
    (``conformance/rank/module_init.py``): a meta cell's setup is bounded from these."""

    name: str  # as named_modules gives it ("" for the root)
    peak: int | None  # bytes at the peak of to_empty + reset_parameters (None: no reset_parameters)
    kept: int | None  # what its tensors hold after the reset
    # buffers the reset gave another dtype or shape -> the bytes they hold after it
    replaced: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class LossRegion:
    """The kit's loss and autograd's way back to the output, measured eagerly on the rank
    (``conformance/rank/eager.loss_region``): the backward phase allocates it around
    Thunder's backward."""

    peak: int  # its peak over what was alive before the loss
    handed: int  # alive when the output's gradient reaches Thunder (the gradient included)


@dataclasses.dataclass
class PlainPlan:
    """Plain ``thunder.jit``'s forward plan for the cell's model on this rank
    (``conformance/rank/plain_jit.py``)."""

    returned: int = 0  # bytes its forward allocates and returns: the output and the tensors it saves
    saved_parameters: list[str] = dataclasses.field(default_factory=list)  # parameters it saves, by storage name
    error: str | None = None  # why there is none: plain jit of the model raised


@dataclasses.dataclass
class MemoryRecord:
    """Bytes on the rank's device. Setup's peak is of what setup allocated; the forward,
    backward and optimizer step of the measured step are read from the end of setup, so they
    include what earlier phases left alive (see ``conformance/rank/measure.Ledger``)."""

    peaks: dict[str, int]  # phase -> peak bytes: setup's own; forward, backward, step from the end of setup
    # setup, forward and backward of the eager model on this rank's input, and what its forward
    # left alive ("alive after forward")
    eager_peaks: dict[str, int]
    alive_after_setup: int  # every live storage of more than one element right after setup, less the kit's own
    scalars_after_setup: int  # storages only 0-d tensors view, alive then (counted, not summed)
    alive_after_forward: int  # what the measured forward allocated and left alive at its end
    held_before_forward: int  # what the Thunder side held when the measured forward began
    held_after_backward: list[int]  # the same after each backward (the forward's result released)
    held_after_step: list[int]  # bytes the Thunder side allocated in training and still held after each step
    step_peaks: list[int]  # each optimizer step's peak over what was held just before it
    eager_step_peaks: list[int]  # the same optimizer's, stepping eager tensors of the shard shapes
    saved: list[SavedTensor | None] | None  # held by the autograd node between forward and backward
    forward_held: ForwardHeld | None = None  # storage by storage (PyTorch's parallelism's cells, CPU)
    module_inits: list[ModuleInit] = dataclasses.field(default_factory=list)  # meta init only
    loss: LossRegion | None = None  # around the measured backward
    plain: PlainPlan | None = None  # the reference for the forward's plan (cells that do not offload)
    # why nothing after setup was measured (``rank/measure.unmeasurable``): every number of
    # the training phases above is then zero, and no check reads it
    unmeasured: str | None = None


@dataclasses.dataclass
class SimulatedMemory:
    """Bytes on a sampled rank of a simulated world: setup is all that moves no data."""

    setup_peak: int  # what setup allocated at its peak
    alive_after_setup: int  # every live storage of more than one element right after setup, less the kit's own
    scalars_after_setup: int  # storages only 0-d tensors view, alive then
    module_inits: list[ModuleInit] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ScenarioRecord:
    """What a cell's scenario did after training (conformance/rank/scenarios/): one more use of
    the Thunder module beside eager PyTorch holding the Thunder module's own gathered weights
    (so that the comparison does not depend on how far training let the two drift apart) and,
    below float32, that eager model's float32 twin. A field the scenario does not produce
    stays None."""

    scenario: str  # the cell's ``scenario`` axis value
    output: torch.Tensor | None = None  # this rank's output from the Thunder module
    eager_output: torch.Tensor | None = None
    twin_output: torch.Tensor | None = None
    requires_grad: bool | None = None  # whether that output asked for a gradient
    grads: Tensors | None = None  # full gradients after the scenario's backward(s), gathered
    eager_grads: Tensors | None = None
    twin_grads: Tensors | None = None
    # below float32: eager's gradients of each rank's own loss in the cell's dtype
    # (numerics.tolerances.Local), where the scenario's gradients are one reduction of the ranks'
    local: RankGradients | None = None
    # gradients a recognisable mistake would produce, by what names it (eager's and the twin's),
    # so that a failure can say which one Thunder made, e.g. "the last micro-step's alone"
    alternatives: dict[str, tuple[Tensors, Tensors | None]] = dataclasses.field(default_factory=dict)
    alternatives_local: dict[str, RankGradients] = dataclasses.field(default_factory=dict)  # below float32
    traces: FinalTraces | None = None  # what Thunder compiled for the scenario (backward: None without one)
    error: str | None = None  # what Thunder raised instead (the training's findings still stand)
    resumed: list[Resumed] = dataclasses.field(default_factory=list)  # ``resume``: each checkpoint kind's round trip
    rank0_only: RankZeroOnly | None = None  # ``resume``: the full checkpoint on rank 0 alone
    # under PyTorch's parallelism: what the scenario issued at the process group, per phase
    # (Thunder's traces hold none of it: ``traces`` stays None)
    issued: list[Issued] | None = None
    # asynchronous collectives Thunder issued through torch.distributed during the scenario
    # (the sync on leaving no_sync) and never waited on, each "phase: call"
    unwaited: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SimulatedRecord:
    """One sampled rank of a simulated world (torch's fake process group: collectives return
    at once and move nothing). The model was built on the meta device with its weights in
    the row pattern (fixtures/patterns.py), so a shard's values name the rows it holds;
    nothing that needs another rank's data (numerics, state dicts) can be judged."""

    cell: Cell
    rank: int  # the rank this process acted as
    eager_model: nn.Module  # the model on the meta device: shapes and ties, no values
    thunder_module: Any  # live: its shards (one forward and backward ran)
    memory: SimulatedMemory
    timings: dict[str, float]
    traces: FinalTraces | None = None  # Thunder's forward and backward traces of that step
    declared: frozenset[str] = frozenset()  # what the xfails file declares of this cell (checks/declared.py)
    reached: ReachedThunder | None = None  # under PyTorch's parallelism: what Thunder compiled

    @property
    def init(self) -> inits.InitMode:
        return inits.INITS[self.cell.init]

    @property
    def device(self) -> torch.device:
        """Where the shards are, as a real world's record says: the CPU, whatever the session's
        backend (conformance/rank/simulate.py), so its bytes are read exactly, unrounded."""
        return torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class LayerCall:
    """One call of a Linear that a tensor-parallel plan parallelizes, as eager's whole model
    made it (forward hooks: never the model under test)."""

    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    input_requires_grad: bool  # its input's gradient is computed (not a model input)
    itemsize: int  # bytes per element of its output


@dataclasses.dataclass(frozen=True)
class PlannedLayer:
    """A Linear the plan parallelizes: its name, style (fixtures/tensor_parallel.py) and the
    calls one forward of eager's whole model made of it."""

    name: str
    style: str
    calls: list[LayerCall]


@dataclasses.dataclass(frozen=True)
class Placed:
    """How the model under test holds one parameter on this rank: a DTensor's placements (as
    torch prints them: ``Shard(dim=0)``, ``Replicate()``) and its mesh's size, or None for
    both where it is a plain tensor; the shape this rank holds."""

    placements: tuple[str, ...] | None
    mesh_size: int | None
    local_shape: tuple[int, ...]


@dataclasses.dataclass
class TensorParallelStep:
    """One step of a tensor-parallel cell: the whole output every rank holds and, where it
    trained, the full gradients and parameters after the step; eager's whole model's and eager
    tensor parallelism's (the same plan without Thunder) of the same step beside them."""

    output: torch.Tensor
    eager: torch.Tensor
    eager_tp: torch.Tensor
    grads: Tensors | None = None
    eager_grads: Tensors | None = None
    eager_tp_grads: Tensors | None = None
    after: Tensors | None = None
    eager_after: Tensors | None = None
    eager_tp_after: Tensors | None = None
    issued: list[Issued] = dataclasses.field(default_factory=list)  # by the model under test, by phase


@dataclasses.dataclass
class TensorParallelRecord:
    """A cell of tensor parallelism on one rank (conformance/rank/tensor_parallel.py): every
    rank ran the same whole batch."""

    cell: Cell
    rank: int
    world_size: int
    shapes: dict[str, tuple[int, ...]]  # every parameter's full shape, as eager's whole model has it
    layers: list[PlannedLayer]  # what the plan parallelizes, as eager's forward called it
    placements: dict[str, Placed]  # every parameter of the model under test, by eager's name
    steps: list[TensorParallelStep]  # inference: one, nothing trained
    reached: ReachedThunder | None
    timings: dict[str, float]
    declared: frozenset[str] = frozenset()  # what the xfails file declares of this cell (checks/declared.py)
    # memory: every storage alive on the device right after setup (the kit's own left out: eager's
    # model, the device mesh), the bytes of an element of a parameter, and eager's buffers' bytes
    alive_after_setup: int | None = None
    itemsize: int = 4
    buffer_bytes: int = 0

    @property
    def trained(self) -> bool:
        return self.cell.scenario != "inference"


@dataclasses.dataclass
class ReachedThunder:
    """What Thunder compiled of a model composed with PyTorch's parallelism
    (``conformance/rank/reached.py``), from Thunder's and Dynamo's own reports."""

    # functions Thunder compiled and ran: ThunderFX's (each subgraph's Thunder-compiled
    # pieces) or, under thunder.jit, the jitted modules that ran
    compiled: int
    eager_graphs: int  # graphs Dynamo captured that ThunderFX handed to eager whole (none of it supported)
    splits: list[str]  # each split of a captured graph, "REASON_TYPE: what caused it"
    graph_breaks: dict[str, int]  # Dynamo's graph breaks while the cell ran, by reason
    # ThunderFX's pieces of the captured graphs, by who compiled them ("THUNDER",
    # "TORCH_INDUCTOR"): op name -> the calls of it those pieces hold (call_function nodes)
    ops_by_compiler: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class CellRecord:
    cell: Cell
    rank: int
    device: torch.device
    dtype: torch.dtype  # the model's: its parameters, its optimizer's state
    backend: str
    eager_model: nn.Module  # eager single-process model, stepped alongside
    thunder_module: Any  # live, for its shards
    traces: FinalTraces  # Thunder's forward and backward traces of the training steps
    # what the reference offloading transform decided for those traces' compilation
    # (transforms.offload.Decision; None where the cell does not offload or it was never asked)
    offload: Any
    setup: SetupRecord
    steps: list[StepRecord]  # every training step, in order
    state_dict: StateDictRecord | None  # under PyTorch's parallelism through DCP's full state dict
    memory: MemoryRecord
    timings: dict[str, float]
    scenario: ScenarioRecord | None = None  # a scenario beyond training (the cell's axis)
    declared: frozenset[str] = frozenset()  # what the xfails file declares of this cell (checks/declared.py)
    reached: ReachedThunder | None = None  # under PyTorch's parallelism: what Thunder compiled
    # what its forward and backward compute in: the model's dtype but under FSDP2's mixed
    # precision (None, in a record made without it: the model's)
    compute_dtype: torch.dtype | None = None

    @property
    def computes_in(self) -> torch.dtype:
        return self.compute_dtype or self.dtype

    @property
    def before(self) -> ParametersAfter:
        """Full parameters right after setup, as the first step starts from them (the eager model
        adopted those Thunder drew; the float32 twin starts from the eager model's values,
        upcast)."""
        drawn = self.drawn_by_thunder()
        eager = self.setup.eager_initial
        ref = {n: self.setup.initial[n] if drawn is None or n in drawn else t for n, t in eager.items()}
        twin = {n: t.float() for n, t in ref.items()} if self.computes_in != torch.float32 else None
        return ParametersAfter(thunder=self.setup.initial, eager_model=ref, twin=twin)

    @property
    def init(self) -> inits.InitMode:
        return inits.INITS[self.cell.init]

    def drawn_by_thunder(self) -> set[str] | None:
        """The tensors Thunder drew at setup (None: every one; ``inits.drawn_by_thunder``)."""
        from fixtures.models import fixture_for

        fixture = fixture_for(self.cell.model, self.cell.spec)
        return inits.drawn_by_thunder(self.init, lambda: fixture.build(self.cell.tie == "tied"), fixture.fresh)

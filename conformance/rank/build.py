"""Building a cell on a rank: the eager model, the state dict the kit hands Thunder, and
the model under test composed with Thunder's jit and FSDP as the cell's axes say, its setup
measured."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from conformance.checks.buckets import ddp_bucket_mb
from conformance.checks.record import ModuleInit
from conformance.checks.storages import tied_duplicates
from conformance.matrix.cells import Cell
from conformance.matrix.initialization import SetupPlan, StateDictKind, plan
from conformance.rank import measure, progress, raised, waits
from conformance.rank.clock import thunder_call
from conformance.rank.dropout import replace_output_dropout
from conformance.rank.gather import Gathered, clones, gather, shard, snapshot
from conformance.rank.mixed import mixed
from conformance.rank.module_init import module_inits
from conformance.rank.process_group import counted_group
from fixtures import inits, patterns
from fixtures import torch_parallel as tp
from fixtures.checkpointing import checkpointed
from fixtures.compositions import COMPOSITIONS, Composition, Setup, shard_ranks
from fixtures.executors import EXECUTORS, ExecutorChoice
from fixtures.models import ModelFixture, fixture_for
from fixtures.offloads import POLICIES
from fixtures.options import BUCKETINGS, COMPUTE_DTYPES, DTYPES, MIXED, SHARDINGS

SEED = 1234
LOADED_OVER = 7_919  # module init's seed offset where a state dict is loaded over its draws


class Unsupported(Exception):
    """The Thunder under test does not offer what the cell asks for (a probe said so)."""


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What the cell's axes name, looked up in the registries of ``fixtures/``."""

    cell: Cell
    fixture: ModelFixture
    init: inits.InitMode
    composition: Composition
    executors: ExecutorChoice
    plan: SetupPlan
    device: torch.device
    dtype: torch.dtype  # the model's: its parameters, its optimizer's state
    # what its forward and backward compute in: the model's dtype, or FSDP2's mixed precision's
    compute_dtype: torch.dtype
    # a resharded resume: the folder where the world of ``cell.saved_at`` ranks put its checkpoint
    checkpoint: str | None = None

    @property
    def mixed(self) -> bool:
        """FSDP2 computes below the parameters' dtype (``MixedPrecisionPolicy``)."""
        return self.compute_dtype != self.dtype

    @property
    def make(self) -> Callable[[], nn.Module]:
        """The model's constructor, tied and checkpointed as the cell says."""
        return functools.partial(_built, self.fixture.build, self.cell.tie == "tied", self.cell.checkpointing)

    @property
    def source(self) -> int:
        """The rank whose weights every rank ends up with."""
        return self.init.source(self.cell.world_size)

    def drawn_by_thunder(self) -> set[str] | None:
        """The tensors Thunder draws at setup (None: every one; ``inits.drawn_by_thunder``)."""
        return inits.drawn_by_thunder(self.init, self.make, self.fixture.fresh)


def _built(build: Callable[[bool], nn.Module], tied: bool, checkpointing: str) -> nn.Module:
    return checkpointed(build(tied), checkpointing)


def recipe(cell: Cell, device: torch.device) -> Recipe:
    """The cell's parts; raises Unsupported where a probe (the composition's, offloading's,
    the executor's) refuses it."""
    composition, executors = COMPOSITIONS[cell.composition], EXECUTORS[cell.executors]
    for probed in (composition, executors):
        if probed.probe is not None and (reason := probed.probe(device)):
            raise Unsupported(reason)
    if composition.executors_probe is not None and (reason := composition.executors_probe(executors, device)):
        raise Unsupported(reason)
    if POLICIES[cell.offload] is not None:
        from transforms import offload  # Thunder's import, as below

        if reason := offload.unsupported():
            raise Unsupported(reason)
    return Recipe(
        cell=cell,
        fixture=fixture_for(cell.model, cell.spec),
        init=inits.INITS[cell.init],
        composition=composition,
        executors=executors,
        plan=plan(cell),
        device=device,
        dtype=DTYPES[cell.dtype],
        compute_dtype=COMPUTE_DTYPES[cell.dtype],
    )


@dataclasses.dataclass
class EagerModel:
    """The eager single-process model the cell is compared with."""

    module: nn.Module
    shapes: dict[str, torch.Size]  # full shape of every parameter, one name per tied group
    initial: dict[str, torch.Tensor]  # CPU copies of its parameters as built
    setup_peak: int  # bytes eager PyTorch allocated at its peak while constructing it
    replicated: bool = False  # the Thunder module holds whole parameters on every rank (DDP)
    # PyTorch's parallelism: a parameter or gradient may be a DTensor (FSDP2's)
    dtensors: bool = False
    # meta init: each module initialized on its own as Thunder materializes it
    module_inits: list[ModuleInit] = dataclasses.field(default_factory=list)
    # hybrid sharding: the ranks whose shards make this rank's parameters (its row of the mesh)
    shard_ranks: tuple[int, ...] | None = None

    def gather(self, tm: Any, grads: bool = False) -> Gathered:
        """The Thunder module's full parameters (or gradients), by this model's names, each
        expected in the dtype of eager's."""
        dtypes = {n: p.dtype for n, p in self.module.named_parameters()}
        with progress.phase("gathering gradients" if grads else "gathering parameters"):
            return gather(
                tm,
                self.shapes,
                grads=grads,
                replicated=self.replicated,
                dtypes=dtypes,
                dtensors=self.dtensors,
                shard_ranks=self.shard_ranks,
            )

    def kit_pointers(self) -> set[int]:
        """Storages the kit holds for the eager model: not the Thunder module's to account for."""
        return measure.pointers(*self.module.parameters(), *self.module.buffers(), *self.initial.values())


def eager_module_inits(recipe: Recipe, device: torch.device) -> list[ModuleInit]:
    """Eager's initialization of each module Thunder's materialization initializes on its own:
    every one under module init (of a partly-meta model, its fresh part's), only those with
    non-persistent buffers where it loads a state dict (the rest come from the state dict)."""
    only = set(recipe.fixture.fresh) if recipe.init.partly_meta else None
    non_persistent_only = recipe.plan.materialize != "module"
    return module_inits(recipe.make, recipe.dtype, device, non_persistent_only=non_persistent_only, only=only)


def _materializes(init: inits.InitMode) -> bool:
    """Whether Thunder's materialization draws some module of the model (its readings matter)."""
    return init.on_meta or init.partly_meta


def build_eager_model(recipe: Recipe) -> EagerModel:
    torch.manual_seed(SEED + recipe.source)
    with torch.device(recipe.device), measure.measure(recipe.device) as construction:
        module = recipe.make().to(recipe.dtype)
    replace_output_dropout(module, recipe.fixture.output_dropout)
    if recipe.mixed:
        mixed(module, recipe.compute_dtype, recipe.composition.fsdp2_wrap)
    return EagerModel(
        module=module,
        shapes={n: p.shape for n, p in module.named_parameters()},
        initial=snapshot(module),
        setup_peak=construction.peak,
        replicated=recipe.composition.replicated,
        dtensors=recipe.composition.parallelism == "torch",
        module_inits=eager_module_inits(recipe, recipe.device) if _materializes(recipe.init) else [],
        shard_ranks=shard_ranks(dist.get_rank(), recipe.cell.world_size) if recipe.composition.hybrid else None,
    )


@dataclasses.dataclass
class Composed:
    thunder_module: Any
    setup_peak: int  # bytes allocated at the peak of setup (construction, jit, sharding, materialization)
    setup_s: float
    transforms: list[Any]  # the cell's transforms beside sharding (cell_transforms), as handed to Thunder
    # under PyTorch's parallelism, what loading the full state dict at setup raised (named)
    loaded_error: str | None = None
    # asynchronous collectives Thunder's setup issued and never waited on (conformance/rank/waits.py)
    unwaited: list[str] = dataclasses.field(default_factory=list)


def compose(recipe: Recipe, eager_model: EagerModel) -> Composed:
    """Build the model under test and compose it with Thunder as the cell says, measuring setup."""
    rank, world = dist.get_rank(), dist.get_world_size()
    began = time.perf_counter()
    options: dict[str, Any] = {
        "sharding_strategy": _enum("FSDPType", SHARDINGS[recipe.cell.sharding]),
        "bucketing_strategy": _enum("FSDPBucketingStrategy", BUCKETINGS[recipe.cell.bucketing]),
    }
    if recipe.init.broadcast:
        options["broadcast_from"] = recipe.source
    # DDP: the bucket size the cell's bucketing names (buckets.ddp_bucket_mb), and a
    # broadcast only where the init mode asks for one (DDP's own default broadcasts rank 0)
    ddp_options = {
        "bucket_size_in_mb": ddp_bucket_mb(eager_model.module, recipe.cell.bucketing),
        "broadcast_from": recipe.source if recipe.init.broadcast else None,
    }
    # What the kit hands over is built outside the measured block: it is the user's memory.
    state = _state_dict(recipe.plan.handed_over, eager_model.module, rank, world)
    materialization_init = _materialization(recipe.plan, state)
    transforms = cell_transforms(recipe.cell, recipe.device)
    # PyTorch's parallelism issues its collectives on a group that counts them (made once per
    # world, outside the measured setup: it is the kit's)
    group = counted_group() if recipe.composition.parallelism == "torch" else None
    # Thunder's transforms call torch.distributed themselves (PyTorch's parallelism waits in its hooks)
    unwaited: list[str] = []
    tracking = waits.awaited(unwaited, "setup") if group is None else contextlib.nullcontext()
    with measure.measure(recipe.device) as setup, thunder_call("Thunder's transforms"), tracking:
        # where a state dict is loaded after module init, module init draws other values than
        # the eager model the state dict comes from: a load that writes nothing then shows
        offset = LOADED_OVER if recipe.plan.load_after else 0
        torch.manual_seed(SEED + (rank if recipe.init.broadcast else 0) + offset)
        model = inits.build(recipe.init, recipe.make, recipe.device, recipe.dtype, recipe.fixture.fresh)
        how = Setup(
            recipe.device,
            materialization_init,
            options,
            transforms,
            recipe.executors.jit_options(),
            ddp_options,
            fsdp2_reshard=recipe.cell.sharding == "zero3",
            fsdp2_mixed=MIXED.get(recipe.cell.dtype),
            process_group=group,
        )
        tm = recipe.composition.build(model, how)
        loaded_error = None
        if recipe.composition.parallelism == "torch":
            if recipe.init.on_meta:
                # off CUDA, DTensor draws each shard from its rank's own generator (no RNG
                # tracker): a seed shared by the ranks would make every shard a copy of rank 0's
                torch.manual_seed(SEED + rank)
                tp.materialize(tm.model, recipe.device)
            if state is not None:
                try:  # DCP broadcasts the full state dict from rank 0: no other rank holds it
                    tp.load_full_state_dict(tm.model, state if rank == 0 else {})
                except Exception as exc:  # a ThunderModule in the model: a finding, named
                    loaded_error = raised.named(exc)
        elif recipe.plan.load_after == "original":
            tm.load_original_state_dict(state)
        elif recipe.plan.load_after == "transformed":
            tm.load_state_dict(state)
    return Composed(tm, setup.peak, time.perf_counter() - began, transforms, loaded_error, unwaited)


def _materialization(setup: SetupPlan, state: dict[str, torch.Tensor] | None) -> Any:
    """The MaterializationTransform init: module init, or from ``state`` (original or transformed)."""
    from thunder.transforms import MaterializationTransform

    if setup.materialize == "module":
        return MaterializationTransform.init_from_original_module_init()
    if setup.materialize == "original":
        return MaterializationTransform.init_from_original_state_dict(state)
    return MaterializationTransform.init_from_transformed_state_dict(state)


def _state_dict(
    kind: StateDictKind | None, eager_model: nn.Module, rank: int, world: int
) -> dict[str, torch.Tensor] | None:
    """The state dict the kit hands Thunder, as a user would: "original" or "transformed"."""
    if kind == "original":
        return clones(eager_model.state_dict())
    if kind == "transformed":
        return transformed_state_dict(eager_model, rank, world)
    return None


def transformed_state_dict(eager_model: nn.Module, rank: int, world: int) -> dict[str, torch.Tensor]:
    """The eager model's state dict as FSDP holds it on ``rank``: parameters sharded, buffers whole."""
    names = {n for n, _ in eager_model.named_parameters(remove_duplicate=False)}
    duplicates = tied_duplicates(eager_model)
    return {
        k: _shard_of(v, rank, world) if k in names else v.clone()
        for k, v in eager_model.state_dict().items()
        if k not in duplicates
    }


def _shard_of(full: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's shard of a parameter of the eager model; of a model on the meta device (a simulated
    world's: never real), the shard of its row pattern, made without the rest of it."""
    if full.is_meta:
        return patterns.shard(tuple(full.shape), rank, world, full.dtype)
    return shard(full, rank, world)


def cell_transforms(cell: Cell, device: torch.device) -> list[Any]:
    """The cell's transforms beside sharding: the reference offloading transform, to the CPU."""
    policy = POLICIES[cell.offload]
    if policy is None:
        return []
    from transforms.offload import OffloadTransform

    return [OffloadTransform(policy, source=device, destination="cpu")]


def _enum(name: str, member: str) -> Any:
    import thunder.distributed

    return getattr(thunder.distributed, name)[member]

"""Fixes planted in Thunder: a known non-conformance of the pin, fixed. The xfails entry that
expected it then meets a conforming item, which fails naming the entry as stale (and, over a
whole run, its templates matched nothing): how a nightly of Thunder's main sees a fix the
night it lands, with entries that hold open-ended from the version they were seen on."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from conformance.checks.registry import AREAS
from tests.planted.cells import DDP, NONE, RESUME, Pred
from tests.planted.record import Expect, planted

# the model of xfails.toml's root-names entry (its `when`)
ROOT_OWNED_MODEL: Pred = lambda cell: cell.model == "root_owned"  # noqa: E731


# Every root_owned cell's state_dict item conforms and its entry still expects the dotted
# names: stale. On FSDP's resume cells the item still fails as the gloo checkpoint entry
# expects (an expected failure), so it may stay xfailed there: its root-names template is
# then stale over a whole run only.
@planted(
    {
        "state_dict": Expect(
            lambda c: ROOT_OWNED_MODEL(c) and not (RESUME(c) and not DDP(c)),
            lambda c: ROOT_OWNED_MODEL(c) and RESUME(c) and not DDP(c),
            "but xfails entries cover it",
        ),
    },
    cells=(
        lambda c: ROOT_OWNED_MODEL(c) and not RESUME(c),
        lambda c: not ROOT_OWNED_MODEL(c) and not RESUME(c),
    ),
)
@contextlib.contextmanager
def root_names_without_a_dot() -> Iterator[None]:
    """original_state_dict() names the root module's own parameters and buffers without the
    leading dot (an empty prefix is joined with no '.'), as load_original_state_dict() takes
    them: the pin's non-conformance of xfails.toml's root_owned entry, fixed."""
    from thunder.core import module

    def original_state_dict(
        self: Any, *, destination: dict[str, Any] | None = None, prefix: str = "", keep_vars: bool = False
    ) -> dict[str, Any]:
        names = {name for name, _ in self._model.named_modules()}
        per_module = module._convert_state_dict_to_per_module(self.state_dict(), names)
        if destination is None:
            destination = collections.OrderedDict()
            destination._metadata = collections.OrderedDict()  # type: ignore[attr-defined]
        for name, state in per_module.items():
            for transform in reversed(self._lc_transforms):
                state = transform.reverse_transform_state_dict_for_submodule(self, name, state)
            destination.update({f"{prefix}{name}.{k}" if name else f"{prefix}{k}": v for k, v in state.items()})
        return destination

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module.ThunderModule, "original_state_dict", original_state_dict)
        yield


TORCHCOMPILE_FSDP: Pred = lambda c: c.executors == "torchcompile" and not DDP(c)  # noqa: E731
# where no other numerics entry holds (FSDP's no_sync under accumulate does): numerics then
# names the raises entry stale rather than the other one expected
TORCHCOMPILE_FSDP_OWN_NUMERICS: Pred = lambda c: TORCHCOMPILE_FSDP(c) and c.scenario != "accumulate"  # noqa: E731


# Once the FSDP cells run, the areas that conform there name the raises entry as stale; the
# others judge the compiled traces and may find what the pin's compilation does wrong (under
# ZERO3 the forward saves an all-gather's future, which the backward waits on again: the
# schedule's stray wait, offload's plain-jit comparison) or stay the pin's expected failures.
# Memory judges setup only (rank/measure.unmeasurable). DDP's cells still raise their own.
@planted(
    {
        area: Expect(
            {"materialization": TORCHCOMPILE_FSDP, "numerics": TORCHCOMPILE_FSDP_OWN_NUMERICS}.get(area, NONE),
            TORCHCOMPILE_FSDP,
            "but xfails entries cover it",
        )
        for area in AREAS
    },
    cells=(TORCHCOMPILE_FSDP_OWN_NUMERICS, lambda c: c.executors == "torchcompile" and DDP(c)),
    at_raises=True,
)
@contextlib.contextmanager
def torch_compile_regions_break_their_graph() -> Iterator[None]:
    """The torchcompile executor compiles its regions with ``fullgraph=False`` (Thunder's
    ``torch_compile_fullgraph`` option): Dynamo breaks the graph at FSDP's asynchronous
    collective instead of refusing it, so the FSDP cells run; their raises entry is stale."""
    from thunder.executors import torch_compile

    original = torch_compile.get_compile_option

    def get_compile_option(name: str, description: str) -> Any:
        return False if name == "torch_compile_fullgraph" else original(name, description)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch_compile, "get_compile_option", get_compile_option)
        yield


HYBRID: Pred = lambda cell: cell.composition == "jit_hybrid"  # noqa: E731


# With the broadcast rank mapped by its mesh coordinates, hybrid sharding sets up on every rank
# and trains as eager does: the raises entry meets conforming items (stale) on every hybrid cell
# (ZERO3's backward issues no re-gather there, as on Thunder's other FSDP compositions: the
# pin's ZERO3 entry covers it).
@planted(
    {
        "numerics": Expect(HYBRID, words="but xfails entries cover it"),
        # under ZERO3 the pin's ZERO3 entry covers the missing re-gathers: xfailed there
        "collectives": Expect(lambda c: HYBRID(c) and c.sharding != "zero3", words="but xfails entries cover it"),
    },
    cells=(
        lambda c: HYBRID(c) and c.init == "real_broadcast_last",  # the source in neither of rank 0's groups
        HYBRID,
        lambda c: not HYBRID(c) and c.composition == "plugins_fsdp",
    ),
    at_raises=True,
)
@contextlib.contextmanager
def hybrid_broadcast_rank_mapped() -> Iterator[None]:
    """Thunder's FSDP plugin maps the broadcast rank into this rank's row and column of the
    mesh by its coordinates: FSDP's transform gets the row's member at the source's column as
    the global rank ``torch.distributed.broadcast`` takes, DDP's the source's row, its index in
    the column (it broadcasts on the group itself). The pin looks the source up in each group,
    raising where it is not there, and would hand FSDP's transform an index."""
    with mapped_hybrid():
        yield


@contextlib.contextmanager
def mapped_hybrid(ddp_dim: str = "ddp") -> Iterator[None]:
    """Thunder's FSDP plugin with the broadcast rank mapped by mesh coordinates (the fix above),
    its DDP transform over the mesh's ``ddp_dim`` (another dim: a bug planted on the fix)."""
    from thunder.distributed.transforms.ddp_v2 import DDPTransform
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform
    from thunder.plugins import distributed
    from thunder.transforms import MaterializationTransform

    original = distributed.FSDP.setup_transforms

    def mapped(self: Any) -> list[Any]:
        mesh = self.process_group
        if getattr(mesh, "mesh_dim_names", None) != ("ddp", "fsdp"):
            return original(self)
        source = self.broadcast_from if self.broadcast_from is not None else 0
        source_row, source_column = (int(i) for i in (mesh.mesh == source).nonzero()[0])
        row, _ = mesh.get_coordinate()
        fsdp = FSDPTransform(
            device=self.device,
            broadcast_from=int(mesh.mesh[row, source_column]),  # this row's member at the source's column
            sharding_strategy=self.sharding_strategy,
            bucketing_strategy=self.bucketing_strategy,
            release_original_parameters=True,
            move_state_dict_to_cpu=self.move_state_dict_to_cpu,
            process_group=mesh["fsdp"].get_group(),
        )
        # DDP's transform broadcasts on its group directly: the source's index in the group
        # (in a column, the source's row), where FSDP's goes through torch.distributed.broadcast,
        # which takes a global rank
        ddp = DDPTransform(
            process_group=mesh[ddp_dim].get_group(),
            bucket_size_in_mb=self.ddp_bucket_size_in_mb,
            broadcast_from=source_row if ddp_dim == "ddp" else source_column,
        )
        init = MaterializationTransform.init_from_original_module_init()
        return [fsdp, ddp, MaterializationTransform(fsdp.device, init=init)]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed.FSDP, "setup_transforms", mapped)
        yield

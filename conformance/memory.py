"""Memory: what a rank holds and allocates, per phase, against bounds derived from the model.

Measured on every rank: the peak of bytes allocated during each phase of the second step
(``forward``, ``backward``, ``step``: compiled by then) and during ``setup`` (construction,
jit, sharding, materialization), by a dispatch-mode tracker of storages on CPU or the caching allocator's
statistics on CUDA; and the bytes that stay alive after setup, by a census of every live
tensor storage (profiler peaks cannot see leftovers allocated before they started).

Estimated for setup from the model (``setup_estimate``), and from the traces for forward
and backward: the peak of live bytes in Thunder's final forward and backward
execution traces, computed from the data flow (a tensor lives from its producer to its last
consumer, or to the end if returned), ignoring the ``del`` statements Thunder inserted, so a
Thunder that stops freeing is caught rather than explained away.

Eager PyTorch's peaks for the same model, this rank's input and the same phase are recorded
beside them as a second, independent reference (reported, not bounded: eager is unsharded).

Bounds:
- after setup a rank holds its shards and buffers, nothing more (unsharded originals freed),
  plus SLACK_BYTES for 0-d scalars (4 bytes seen on litgpt);
- under meta init, the setup peak stays within the shards and buffers plus three copies of
  the largest module's own tensors (materialization goes module by module; sharding one holds
  the unsharded tensor, its padded copy and the shard cut from it), plus SLACK_BYTES: the
  whole model is never allocated on one rank;
- under real init, the setup peak stays within ESTIMATE_FACTOR of the model's arithmetic
  (``setup_estimate``: eager PyTorch's construction peak, then every shard cut from a padded
  copy and cloned while the originals live) plus SLACK_BYTES;
- the measured forward and backward peaks stay within ESTIMATE_FACTOR of the estimate plus
  SLACK_BYTES; on gloo the backward may also hold the full gradient of every reduce-scatter
  in flight (gloo reduce-scatters by all-reducing a full-size clone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from conformance.collectives import collective_symbols, distinct_storages, padded_bytes
from conformance.findings import Findings
from transforms.policies import proxy_bytes

if TYPE_CHECKING:
    from conformance.execute import CellRun

ESTIMATE_FACTOR = 1.25
SLACK_BYTES = 256
MATERIALIZATION_COPIES = 3
PHASES = ("setup", "forward", "backward", "step")


class _StorageTracker(TorchDispatchMode):
    """Live bytes of storages that ops allocate on one device while the mode is active.

    A storage is new when no input of the op shares it; its free is seen through a weak
    reference (torch keeps one Python object per storage alive as long as the storage).
    torch's own MemTracker does this too, but leaves module hooks behind that break tracing.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.live = self.peak = 0
        self._refs: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device != self.device:
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if not ptr or ptr in inputs or ptr in self._refs:
                continue
            nbytes = storage.nbytes()
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            self._refs[ptr] = weakref.ref(storage, lambda _, ptr=ptr, n=nbytes: self._free(ptr, n))
        return out

    def _free(self, ptr: int, nbytes: int) -> None:
        self.live -= nbytes
        self._refs.pop(ptr, None)


@contextlib.contextmanager
def measure(
    device: torch.device, into: dict[str, int], phase: str, held: dict[str, int] | None = None
) -> Iterator[None]:
    """Record into ``into[phase]`` the peak bytes allocated on ``device`` during the block,
    and into ``held[phase]`` those of its allocations still alive at its end."""
    settle = held is not None
    held = {} if held is None else held
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield
        torch.cuda.synchronize(device)
        into[phase] = torch.cuda.max_memory_allocated(device) - base
        held[phase] = torch.cuda.memory_allocated(device) - base
        return
    with _StorageTracker(device) as tracker:
        yield
        if settle:
            _settle(tracker)
    into[phase], held[phase] = tracker.peak, tracker.live


def _settle(tracker: _StorageTracker, step_s: float = 0.002, tries: int = 25) -> None:
    """Wait until the tracker's live bytes stop changing: gloo's worker threads let go of a
    finished collective's buffers a moment after ``wait()`` has returned."""
    for _ in range(tries):
        before = tracker.live
        time.sleep(step_s)
        if tracker.live == before:
            return


def census(device: torch.device, exclude: set[int]) -> int:
    """Bytes of every distinct tensor storage alive on ``device``, less those in ``exclude``
    (data pointers of tensors the kit itself holds)."""
    gc.collect()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.device != device or obj.is_meta:
                continue
            storage = obj.untyped_storage()
        except Exception:
            continue
        ptr = storage.data_ptr()
        if ptr and ptr not in exclude:
            seen[ptr] = storage.nbytes()
    return sum(seen.values())


def pointers(*tensors: torch.Tensor) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


# -- the estimate -------------------------------------------------------------------------

_ALIASES = {
    # names of executor and torch symbols whose outputs share their input's storage
    "unsqueeze", "squeeze", "transpose", "expand", "reshape", "view", "permute", "contiguous", "split",
    "chunk", "getitem", "narrow", "flatten", "unflatten", "t", "detach", "torch_prims_reshape_impl",
    "torch_wait_prim_impl", "shallow_copy", "broadcast_in_dim", "slice_prim",
}  # fmt: skip


@dataclasses.dataclass
class _Lifetime:
    nbytes: int
    born: int
    last: int
    device: str
    from_input: bool  # unpacked from the trace's arguments: allocated before it ran


def _lifetimes(trace: Any) -> tuple[dict[str, _Lifetime], int]:
    """Every storage the trace's tensors live in (named by the proxy that owns it), from its
    producer to its last consumer (``end`` if returned), and ``end``."""
    from thunder.core.prims import PrimIDs
    from thunder.core.proxies import FutureTensorProxy, TensorProxy

    def tensors(xs: Any) -> list[Any]:
        return [x for x in xs if isinstance(x, (TensorProxy, FutureTensorProxy))]

    unpacks = {v for k, v in PrimIDs.__members__.items() if k.startswith("UNPACK")}
    root: dict[str, str] = {}  # proxy name -> name of the proxy that owns its storage
    lives: dict[str, _Lifetime] = {}
    bsyms = [b for b in trace.bound_symbols if b.sym.id not in (PrimIDs.DEL,)]
    end = len(bsyms)
    for i, bsym in enumerate(bsyms):
        args = tensors(bsym.flat_proxy_args)
        for a in args:
            owner = root.get(a.name)
            if owner is not None:
                life = lives[owner]
                life.last = end if bsym.sym.id == PrimIDs.RETURN else max(life.last, i)
        if bsym.sym.id == PrimIDs.RETURN:
            continue
        aliasing = bsym.sym.name in _ALIASES and args and args[0].name in root
        for out in tensors(bsym.flat_proxy_outs):
            if out.name in root:
                continue
            if aliasing:
                root[out.name] = root[args[0].name]
            else:
                root[out.name] = out.name
                lives[out.name] = _Lifetime(proxy_bytes(out), i, i, str(out.device), bsym.sym.id in unpacks)
    return lives, end


def estimated_peak(trace: Any, device: torch.device | None = None) -> int:
    """Peak of live bytes among tensors the trace produces (on ``device``, if given), from
    its data flow alone."""
    lives, end = _lifetimes(trace)
    events = [0] * (end + 2)
    for life in lives.values():
        if device is None or life.device == _thunder_device(device):
            events[life.born] += life.nbytes
            events[life.last + 1] -= life.nbytes
    live = peak = 0
    for delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def estimated_held(trace: Any, device: torch.device) -> int:
    """Bytes on ``device`` the trace allocates and returns (a forward's outputs and what it
    saves for backward): what stays allocated between forward and backward."""
    lives, end = _lifetimes(trace)
    return sum(
        life.nbytes
        for life in lives.values()
        if life.last == end and not life.from_input and life.device == _thunder_device(device)
    )


def _thunder_device(device: torch.device) -> str:
    from thunder.core.devices import to_device

    return str(to_device(device))


# -- bounds and the check -----------------------------------------------------------------


def shard_bytes(module: nn.Module, world_size: int) -> int:
    return sum(padded_bytes(p, world_size) for p in distinct_storages(module).values()) // world_size


def largest_module_bytes(module: nn.Module, world_size: int) -> int:
    """The most bytes of parameters and buffers that any one module owns directly (dim 0
    padded to the world size, as sharding pads it)."""
    return max(
        (
            sum(padded_bytes(t, world_size) for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)))
            for m in module.modules()
        ),
        default=0,
    )


def setup_estimate(run: CellRun, held: int) -> int:
    """The peak of setup by the model's arithmetic, for the cell's init mode.

    Real init builds the whole model as eager PyTorch does (its peak measured when the kit
    built the reference: construction is the user's code, not Thunder's), then shards one
    parameter at a time: cut from a padded copy and cloned, the originals released at the
    end. Meta init materializes one module's tensors at a time, pads a copy of each to cut
    its shard from, and keeps only the shards (``held`` in the end: shards and buffers); from
    a transformed (already sharded) state dict only shards are made.
    """
    from conformance.cells import plan

    world = run.cell.world_size
    reference = run.reference
    if run.init.on_meta:
        if plan(run.cell)[0] == "transformed":
            return held
        return held + 2 * largest_module_bytes(reference, world)
    # then parameter by parameter: a padded copy (where dim 0 needs padding) to cut the shard
    # from, the shard cloned into the new parameter; the originals are released once all
    # shards are cut (FSDP walks a list that holds them)
    params = distinct_storages(reference).values()
    live = sharding = sum(p.nbytes for p in params) + sum(b.nbytes for b in reference.buffers())
    for p in params:
        whole, padded = p.nbytes, padded_bytes(p, world)
        piece = padded // world
        sharding = max(sharding, live + (padded if padded != whole else 0) + piece, live + 2 * piece)
        live += piece
    return max(run.eager_memory["setup"], sharding)


def check(run: CellRun) -> Findings:
    import thunder

    found = Findings()
    cell, reference, measured = run.cell, run.reference, run.memory
    world = cell.world_size
    buffers = sum(b.nbytes for b in run.reference_buffers.values())
    held = shard_bytes(reference, world) + buffers
    found.metrics["measured"] = dict(measured)
    found.metrics["eager"] = dict(run.eager_memory)  # unsharded eager model, same input: for comparison

    found.metrics["retained after setup"] = {"measured": run.retained, "bound": held + SLACK_BYTES}
    with found.expect("memory held after setup"):
        assert run.retained <= held + SLACK_BYTES, (
            f"{run.retained} bytes alive after setup, but a rank should hold only its shards and buffers "
            f"({held} bytes): unsharded originals or copies were kept"
        )
    estimate = setup_estimate(run, held)
    if run.init.on_meta:
        bound = held + MATERIALIZATION_COPIES * largest_module_bytes(reference, world) + SLACK_BYTES
    else:
        bound = int(ESTIMATE_FACTOR * estimate) + SLACK_BYTES
    found.metrics["setup peak"] = {
        "measured": measured["setup"],
        "estimate": estimate,
        "bound": bound,
        "ratio": measured["setup"] / estimate if estimate else None,
    }
    with found.expect(f"setup peak under {'meta' if run.init.on_meta else 'real'} init"):
        assert measured["setup"] <= bound, (
            f"setup allocated {measured['setup']} bytes at its peak; the model's arithmetic for "
            f"{run.cell.init} init needs {estimate} (bound {bound})"
        )

    traces = {
        "forward": thunder.last_traces(run.thunder_module)[-1],
        "backward": thunder.last_backward_traces(run.thunder_module)[-1],
    }
    for phase, trace in traces.items():
        estimate = estimated_peak(trace, run.device)
        bound = int(ESTIMATE_FACTOR * estimate) + SLACK_BYTES
        if phase == "backward" and run.backend == "gloo":
            reduce_scatters = len(collective_symbols(trace)["reduce_scatter"])
            trainable = distinct_storages(reference, trainable_only=True).values()
            bound += reduce_scatters and sum(p.nbytes for p in trainable)
        found.metrics[f"{phase} peak"] = {
            "measured": measured[phase],
            "estimate": estimate,
            "bound": bound,
            "ratio": measured[phase] / estimate if estimate else None,
            "eager": run.eager_memory.get(phase),
        }
        with found.expect(f"{phase} peak"):
            assert measured[phase] <= bound, (
                f"{phase} allocated {measured[phase]} bytes at its peak; the trace's data flow needs "
                f"{estimate} (bound {bound}): something is kept alive past its last use"
            )
    return found

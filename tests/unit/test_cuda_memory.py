"""CUDA memory expectations count the caching allocator's blocks (issue #14), on the CPU: the
rounding itself; the memory area's terms, setup estimate and bounds for a CUDA device, by
hand for the mlp model; the CPU numbers unchanged; the offload area's residency estimate; and
the CUDA ledger taking off what a garbage collection releases. No GPU is needed: a
``torch.device("cuda", 0)`` is only a name until something is allocated on it."""

from __future__ import annotations

import gc
import types
from typing import Any

import pytest
import torch

from conformance.checks import memory
from conformance.checks.declared import UNBUCKETED
from conformance.checks.memory import arithmetic, dataflow
from conformance.checks.record import ModuleInit, SimulatedRecord
from conformance.checks.storages import allocated_bytes, allocations, piece_bytes, shard_bytes
from conformance.matrix.cells import Cell
from fixtures.inits import INITS
from fixtures.toy_models import MLP

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("nbytes", "cuda"),
    [(0, 0), (1, 512), (511, 512), (512, 512), (513, 1024), (2**20 + 1, 2**20 + 512)],
)
def test_an_allocation_rounds_up_to_the_block_on_cuda_only(nbytes: int, cuda: int) -> None:
    assert allocated_bytes(nbytes, CUDA) == cuda
    assert allocated_bytes(nbytes, "cuda:1") == cuda  # a record's device may be a string
    assert allocated_bytes(nbytes, CPU) == nbytes
    assert allocated_bytes(nbytes, "cpu") == nbytes


def test_pieces_and_sums_round_each_tensor() -> None:
    assert allocations([4, 600, 0], CUDA) == 512 + 1024
    assert allocations([4, 600, 0], CPU) == 604
    # a 0-d tensor cannot be cut: on CUDA one block on every rank, however large the world
    assert piece_bytes(4, 8, CUDA) == 512
    assert piece_bytes(4, 8, CPU) == 0  # the CPU arithmetic as it always was
    assert piece_bytes(960, 2, CUDA) == 512 and piece_bytes(960, 2, CPU) == 480


def _run(
    device: torch.device, init: str = "real", world: int = 2, bucketing: str = "none", composition: str = "jit_fsdp"
) -> Any:
    """The fields of a CellRecord that the memory area's arithmetic reads."""
    cell = Cell(model="mlp", init=init, composition=composition, world_size=world, bucketing=bucketing)
    return types.SimpleNamespace(
        cell=cell,
        eager_model=MLP(),
        device=device,
        backend="nccl" if device.type == "cuda" else "gloo",
        init=INITS[init],
        memory=types.SimpleNamespace(eager_peaks={"setup": 1000}),
        declared=frozenset(),
    )


# MLP(12, 20, 7) over 2 ranks, dim 0 padded to even: fc1.weight 960 B, fc1.bias 80, fc2.weight
# 560 (640 padded), fc2.bias 28 (32 padded); shards 480, 40, 320, 16.
def test_terms_on_cuda_count_one_block_per_tensor() -> None:
    model = arithmetic.terms(_run(CUDA))
    assert model == arithmetic.Terms(
        shards=4 * 512,  # four shards, each under one block
        buffers=0,
        unsharded=1024 + 512 + 1024 + 512,  # every all-gathered parameter
        gradient_shards=4 * 512,
        adamw_state=2 * 4 * 512,  # exp_avg, exp_avg_sq per shard; the step counters are on the CPU
        handed_over=0,
    )
    assert model.resident == 2048 and model.optimizer_state("AdamW") == 4096 and model.optimizer_state("SGD") == 0


def test_terms_on_cpu_are_the_plain_bytes() -> None:
    model = arithmetic.terms(_run(CPU))
    assert model == arithmetic.Terms(
        shards=856, buffers=0, unsharded=1712, gradient_shards=856, adamw_state=1712, handed_over=0
    )
    assert model.resident == 856  # README: the mlp cell holds exactly its 856 bytes of shards


def test_the_state_dict_handed_over_rounds_each_entry() -> None:
    assert arithmetic.terms(_run(CUDA, "meta_original_sd")).handed_over == 1024 + 512 + 1024 + 512
    assert arithmetic.terms(_run(CPU, "meta_original_sd")).handed_over == 960 + 80 + 560 + 28
    assert arithmetic.terms(_run(CUDA, "meta_transformed_sd")).handed_over == 4 * 512
    assert arithmetic.terms(_run(CPU, "meta_transformed_sd")).handed_over == 856


def test_setup_estimate_and_bounds_round_each_tensor() -> None:
    # real init, parameter by parameter: the originals (3072 on CUDA), then fc2.weight's
    # padded copy (1024) and its shard (512) beside the two shards cut before it
    assert arithmetic.setup_estimate(_run(CUDA), 2048) == 3072 + 2 * 512 + 1024 + 512
    assert arithmetic.setup_estimate(_run(CPU), 856) == 1628 + 480 + 40 + 640 + 320
    # meta init (tests/unit/test_setup_path.py): eager's readings are the allocator's on CUDA
    # (each Linear: weight and bias a block each), the cutting rounds each copy and shard.
    # fc2's init beside fc1 kept: 1536 + 1536; fc2 cut: fc2 (1536), the weight's padded copy
    # (1024) and shard (512), the same again for its bias (the weight's shard, 512 and 512)
    inits = [ModuleInit("fc1", peak=1536, kept=1536), ModuleInit("fc2", peak=1536, kept=1536)]
    run = _run(CUDA, "meta_module_init")
    run.memory.module_inits = inits
    assert arithmetic.setup_estimate(run, 2048) == 2048 + 1536 + 1536
    # the gloo allowance (the two largest gathered units, one per worker thread: fc1's and
    # fc2's weights unbucketed) rounds each of its tensors too
    gloo_on_cuda = _run(CUDA)
    gloo_on_cuda.backend = "gloo"
    assert arithmetic.late_release(gloo_on_cuda) == 1024 + 1024
    assert arithmetic.late_release(_run(CPU)) == 960 + 640
    assert arithmetic.late_release(_run(CUDA)) == 0  # NCCL: no late release


def test_ddp_setup_under_real_init_is_the_construction_exactly() -> None:
    # DDP cuts nothing and broadcasts in place: no FSDP walk, no factor. The eager model's
    # construction peaked at 1000 B here, under the model's 1628 B: the model bounds it
    ddp = _run(CPU, composition="ddp_jit")
    model = arithmetic.terms(ddp)
    assert arithmetic.setup_estimate(ddp, model.resident) == 1628
    assert memory._setup_bound(ddp, model, 1628) == 1628
    ddp.memory.eager_peaks["setup"] = 2400  # a construction that made and dropped a temporary
    assert arithmetic.setup_estimate(ddp, model.resident) == 2400
    # FSDP's sharding walk is read exactly on the CPU; on CUDA its bound keeps a factor for the
    # caching allocator's larger cached blocks
    fsdp = _run(CPU)
    assert memory._setup_bound(fsdp, arithmetic.terms(fsdp), 1000) == 1000
    on_cuda = _run(CUDA)
    assert memory._setup_bound(on_cuda, arithmetic.terms(on_cuda), 1000) == 1250


def test_the_gloo_allowance_is_a_bucket_per_thread_or_parameters_where_the_xfails_file_says_so() -> None:
    # LAYER buckets of MLP over 2 ranks: fc1 (960 + 80 B) and fc2 (640 + 32 B padded), one
    # per gloo worker thread
    layer = _run(CPU, bucketing="layer")
    assert arithmetic.late_release(layer) == 960 + 80 + 640 + 32
    # a Thunder declared to gather per parameter has parameters in flight, never buckets:
    # a bucket's bytes would hide a gathered parameter kept to the forward's end
    layer.declared = frozenset({UNBUCKETED})
    assert arithmetic.late_release(layer) == 960 + 640


def test_gloo_runs_collectives_on_as_many_threads_as_the_allowance_counts() -> None:
    """The allowance's thread count is torch's: read off a real gloo process group (one
    rank, its own store: no global state)."""
    import datetime

    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    assert group.options._threads == arithmetic.GLOO_THREADS


def test_shard_bytes_keeps_its_cpu_default() -> None:
    assert shard_bytes(MLP(), 2) == 856 and shard_bytes(MLP(), 2, CUDA) == 2048
    assert shard_bytes(MLP(), 2, CUDA, trainable_only=True) == 2048


def test_a_simulated_world_is_read_on_the_cpu() -> None:
    assert SimulatedRecord.device.fget(None) == CPU  # type: ignore[attr-defined]


def test_trace_estimates_round_each_storage_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    on = dataflow.thunder_device(CUDA)
    lives = {
        "out": dataflow.Lifetime(100, 0, 3, on, False),  # returned
        "saved": dataflow.Lifetime(600, 1, 3, on, False),  # returned
        "tmp": dataflow.Lifetime(40, 1, 2, on, False),  # freed before the end
        "arg": dataflow.Lifetime(4000, 0, 3, on, True),  # an input: allocated before the trace
    }
    monkeypatch.setattr(dataflow, "lifetimes", lambda trace, not_returned=(): (lives, 3))
    assert dataflow.estimated_returned(None, CUDA) == 512 + 1024


def test_the_cuda_ledger_takes_off_what_a_collection_frees(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NCCL work object caught in a reference cycle keeps its buffer until the garbage
    collector runs: reading the ledger collects it and counts the free."""
    from conformance.rank import measure

    stats = {"allocated": 0, "peak": 0}  # the allocator's statistics, stood in for

    class Buffer:
        def __init__(self, nbytes: int) -> None:
            self.nbytes = nbytes
            stats["allocated"] += nbytes
            stats["peak"] = max(stats["peak"], stats["allocated"])
            self.cycle = self

        def __del__(self) -> None:
            stats["allocated"] -= self.nbytes

    def reset(device: Any = None) -> None:
        stats["peak"] = stats["allocated"]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: stats["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: stats["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    gc.collect()
    gc.disable()  # only the ledger's own collection may free the cycle
    try:
        ledger = measure.Ledger(CUDA)
        with ledger.phase() as reading:
            Buffer(1024)
        assert reading.alive == 1024  # still held: the cycle is garbage, not yet collected
        assert ledger.read() == 0
        with measure.measure(CUDA, settle=True) as block:
            Buffer(512)
        assert block.peak == 512 and block.alive == 0
    finally:
        gc.enable()


def test_cublas_is_warmed_in_the_calling_thread_and_in_the_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NCCL rank warms cuBLAS and cuBLASLt before its first cell (their workspaces, 33 MiB
    on an H200, were counted as Thunder's held memory otherwise: docs/gpu-runs.md). On the CPU
    the same calls run; what is asserted is that both kinds of call run in the forward and
    again inside a backward, where autograd's own thread runs them on a GPU."""
    from conformance.world import rankloop

    calls: list[tuple[str, bool]] = []
    linear, matmul = torch.nn.functional.linear, torch.Tensor.__matmul__

    def counted(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, torch.is_grad_enabled()))
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(torch.nn.functional, "linear", counted("linear", linear))
    monkeypatch.setattr(torch.Tensor, "__matmul__", counted("matmul", matmul))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    rankloop._warm_cublas(CPU)
    # two dtypes each, first in the forward (grad mode on), then in the backward (grad mode off)
    assert calls == [("matmul", True), ("linear", True)] * 2 + [("matmul", False), ("linear", False)] * 2

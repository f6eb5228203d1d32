"""The executors axis without a GPU: what each value hands ``thunder.jit``, why a value the
environment lacks is refused (a CPU world, a CUDA device without nvFuser, nvFuser found,
torch.compile without Triton or a C compiler), the ids it gives cells, and collectives
counted where an executor fused them into a region.

Which cells the profiles give the axis is tests/unit/test_profiles.py's business."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from conformance.checks import traces
from conformance.matrix.axes import cell_from_axes
from conformance.matrix.cells import Cell
from fixtures import executors
from fixtures.executors import EXECUTORS

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def test_each_value_names_exactly_the_executors_it_puts_first() -> None:
    assert EXECUTORS["default"].jit_options() == {}  # Thunder's own default list
    assert EXECUTORS["torch_only"].jit_options() == {"executors": []}  # torch and python only
    assert EXECUTORS["nvfuser"].jit_options() == {"executors": ["nvfuser"]}
    assert EXECUTORS["torchcompile"].jit_options() == {"executors": ["torchcompile"]}
    # the two always offered need no probe
    assert {n for n, e in EXECUTORS.items() if e.probe is None} == {"default", "torch_only"}


def test_the_values_resolve_to_thunders_executors() -> None:
    import thunder

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    jitted = thunder.jit(f, **EXECUTORS["torch_only"].jit_options())
    jitted(torch.ones(2))
    # Thunder's ad hoc executor (for callables it is handed) leads every list
    names = [e.name for e in thunder.compile_data(jitted).executors_list if not e.name.startswith("__ad_hoc")]
    assert names == ["torch", "python"]


def test_executors_that_need_cuda_say_so_on_a_cpu_world() -> None:
    assert "CUDA kernels only" in executors._nvfuser_unsupported(CPU)


def test_torch_compile_runs_on_a_cpu_world_with_a_cpp_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor builds CPU kernels from C++: with a compiler on PATH the executor is offered on
    the CPU (the kit then measures its cells through setup only: rank/measure.unmeasurable)."""
    import thunder.extend

    monkeypatch.setattr(thunder.extend, "get_executor", lambda name: object())
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    try:
        executors._torchcompile_unsupported.cache_clear()
        assert "C++ compiler" in executors._torchcompile_unsupported(CPU)
        executors._torchcompile_unsupported.cache_clear()
        monkeypatch.setenv("CXX", sys.executable)  # an executable named by CXX, as inductor reads it
        assert executors._torchcompile_unsupported(CPU) is None
    finally:
        executors._torchcompile_unsupported.cache_clear()


def test_a_cuda_device_without_nvfuser_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import thunder.extend

    executors._nvfuser_unsupported.cache_clear()
    monkeypatch.setattr(thunder.extend, "get_executor", lambda name: None)
    try:
        assert "no executor 'nvfuser'" in executors._nvfuser_unsupported(CUDA)
        monkeypatch.setattr(thunder.extend, "get_executor", lambda name: object())
        executors._nvfuser_unsupported.cache_clear()
        assert executors._nvfuser_unsupported(CUDA) is None
    finally:
        executors._nvfuser_unsupported.cache_clear()


def test_torch_compile_without_what_its_kernels_need_is_the_environments_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import thunder.extend
    import torch.utils._triton

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("planted: Thunder's torchcompile broke")

    monkeypatch.setattr(thunder.extend, "get_executor", lambda name: object())
    monkeypatch.setattr(thunder, "jit", broken)  # never asked: a breakage is the cells' to show
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CC", raising=False)
    try:
        for triton, why in ((False, "Triton, which is not installed or does not support cuda:0"), (True, "C compiler")):
            executors._torchcompile_unsupported.cache_clear()
            monkeypatch.setattr(torch.utils._triton, "has_triton", lambda triton=triton: triton)
            assert why in executors._torchcompile_unsupported(CUDA)
        executors._torchcompile_unsupported.cache_clear()
        monkeypatch.setenv("CC", sys.executable)  # an executable named by CC, as Triton reads it
        assert executors._torchcompile_unsupported(CUDA) is None
    finally:
        executors._torchcompile_unsupported.cache_clear()


def test_ids_name_an_executor_only_where_it_is_not_the_default() -> None:
    plain = Cell("mlp", "real", "fsdp_jit")
    assert plain.id == "mlp-real-fsdp_jit-untied-none-zero2-none-float32-ws2"  # as before the axis
    assert "executors" not in plain.axes()
    other = Cell("mlp", "real", "fsdp_jit", executors="torch_only", world_size=3)
    assert other.id == "mlp-real-fsdp_jit-untied-none-zero2-none-float32-torch_only-ws3"
    assert cell_from_axes(json.loads(json.dumps(other.axes()))) == other
    with pytest.raises(ValueError, match="executors 'cudnn' is not one of"):
        cell_from_axes({**plain.axes(), "executors": "cudnn"})


def _bsym(sym_id: object, subsymbols: tuple = (), is_fusion: bool = False) -> types.SimpleNamespace:
    return types.SimpleNamespace(sym=types.SimpleNamespace(id=sym_id, is_fusion=is_fusion), subsymbols=subsymbols)


def test_collectives_fused_into_a_region_are_counted_once() -> None:
    from thunder.distributed.prims import PrimIDs

    gather = _bsym(PrimIDs.ALL_GATHER, subsymbols=(_bsym(PrimIDs.ALL_GATHER),))  # its own decomposition
    region = _bsym("TorchCompile0", subsymbols=(gather, _bsym("mul")), is_fusion=True)
    plain = _bsym("linear", subsymbols=(_bsym(PrimIDs.REDUCE_SCATTER),))  # not a fusion: not read
    trace = types.SimpleNamespace(bound_symbols=[region, _bsym(PrimIDs.REDUCE_SCATTER), plain])
    found = traces.collective_symbols(trace)
    assert found["all_gather"] == [gather]
    assert len(found["reduce_scatter"]) == 1

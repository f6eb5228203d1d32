"""The reference offloading transform on its own, in one process on the CPU (CPU to CPU):
policies, numerics against the same model jitted without it, and where it puts its ops.
The suite's offload area checks the same promises inside the distributed world."""

from __future__ import annotations

import dataclasses

import pytest
import thunder
import torch
from hypothesis import given
from hypothesis import strategies as st

from fixtures.offloads import POLICIES
from transforms import policies


class Net(torch.nn.Module):
    """Saved intermediates of several ops and sizes: relu masks, a tanh output, linear inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(6, 16), torch.nn.Linear(16, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.relu(self.a(x)))))


def _run(policy: policies.Policy | None) -> tuple[object, torch.Tensor, list[torch.Tensor], tuple[torch.Tensor, ...]]:
    from transforms.offload import OffloadTransform

    torch.manual_seed(0)
    model = Net()
    transforms = [] if policy is None else [OffloadTransform(policy, source="cpu", destination="cpu")]
    jitted = thunder.jit(model, transforms=transforms)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    out = jitted(x)
    saved = out.grad_fn.saved_tensors
    grads = torch.autograd.grad(out, list(model.parameters()), torch.ones_like(out))
    return jitted, out, list(grads), saved


@pytest.mark.parametrize("name", [n for n in POLICIES if n != "none"])
def test_offloads_what_the_policy_selects_and_changes_no_number(name: str) -> None:
    from conformance.checks.offload import saved_without_offloading
    from transforms.offload import is_offloaded, load, offload, saved_intermediates

    _, plain_out, plain_grads, _ = _run(None)
    jitted, out, grads, saved = _run(POLICIES[name])
    torch.testing.assert_close(out, plain_out, rtol=0, atol=0)
    for g, plain in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(g, plain, rtol=0, atol=0)

    forward = thunder.last_traces(jitted)[-1]
    backward = thunder.last_backward_traces(jitted)[-1]
    copies = {b.output.name for b in forward.bound_symbols if b.sym.id == offload.id}
    _, original = saved_without_offloading(forward)
    selected = POLICIES[name].select(saved_intermediates(forward, original, torch.device("cpu")), forward)
    assert selected, f"policy {name} selects nothing on the test model: the test would prove nothing"
    assert {t.name for t in selected} == {
        t.name for t, held in zip(original, saved, strict=True) if is_offloaded(held)
    }, "the autograd node holds offloaded exactly the selected tensors"
    assert len(copies) == len(selected)
    assert sorted(b.args[0].name for b in backward.bound_symbols if b.sym.id == load.id) == sorted(copies)


def test_each_load_sits_right_before_its_consumer() -> None:
    from thunder.core.prims import PrimIDs

    from transforms.offload import load

    jitted, *_ = _run(policies.All())
    bsyms = [b for b in thunder.last_backward_traces(jitted)[-1].bound_symbols if b.sym.id != PrimIDs.DEL]
    loads = [i for i, b in enumerate(bsyms) if b.sym.id == load.id]
    assert loads
    for i in loads:
        reads = {a.name for a in bsyms[i + 1].flat_proxy_args if hasattr(a, "name")}
        assert bsyms[i].output.name in reads, f"{bsyms[i + 1].sym.name} follows the load of {bsyms[i].output.name}"


def test_inference_traces_are_left_alone() -> None:
    from transforms.offload import OffloadTransform, offload

    torch.manual_seed(0)
    jitted = thunder.jit(Net(), transforms=[OffloadTransform(policies.All(), source="cpu", destination="cpu")])
    with torch.no_grad():
        jitted(torch.randn(2, 6))
    assert not [b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.id == offload.id]


# -- policies, on stand-ins for tensor proxies -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _DType:
    bytes: int


@dataclasses.dataclass(frozen=True)
class _Proxy:
    name: str
    shape: tuple[int, ...]
    dtype: _DType = _DType(4)


_proxies = st.lists(st.integers(1, 64), min_size=1, max_size=12).map(
    lambda sizes: [_Proxy(f"t{i}", (n,)) for i, n in enumerate(sizes)]
)


@given(_proxies, st.floats(0.05, 1.0))
def test_largest_fraction_takes_the_largest_until_the_fraction(candidates: list[_Proxy], fraction: float) -> None:
    chosen = policies.LargestFraction(fraction).select(candidates, None)
    size = policies.proxy_bytes
    total = sum(size(t) for t in candidates)
    assert sum(size(t) for t in chosen) >= fraction * total
    assert sum(size(t) for t in chosen) - min(size(t) for t in chosen) < fraction * total, "one too many"
    left = [t for t in candidates if t not in chosen]
    assert all(size(t) <= min(size(c) for c in chosen) for t in left), "a larger tensor left behind"
    assert [t for t in candidates if t in chosen] == list(chosen), "trace order kept"


@given(_proxies, st.integers(0, 300))
def test_min_bytes_is_a_threshold(candidates: list[_Proxy], threshold: int) -> None:
    chosen = policies.MinBytes(threshold).select(candidates, None)
    assert list(chosen) == [t for t in candidates if policies.proxy_bytes(t) >= threshold]


@pytest.mark.parametrize("name", ["all", "largest_fraction"])
def test_the_forward_handed_to_the_transform_predicts_what_the_final_one_returns(name: str) -> None:
    """The offload area judges residency against the forward Thunder handed the transform (its
    Decision), each chosen tensor returned as its copy: with a correct Thunder that is, to the
    byte, what the final trace's data flow returns."""
    from conformance.checks.memory.dataflow import estimated_returned
    from transforms.offload import OffloadTransform

    cpu = torch.device("cpu")
    transform = OffloadTransform(POLICIES[name], source="cpu", destination="cpu")
    jitted = thunder.jit(Net(), transforms=[transform])
    jitted(torch.randn(5, 6))
    decision = transform.decisions[-1]
    chosen = [t for t in decision.forward.bound_symbols[-1].flat_proxy_args if t.name in decision.chosen]
    assert decision.chosen and len({t.name for t in chosen}) == len(decision.chosen)
    copies = sum(policies.proxy_bytes(t) for t in {t.name: t for t in chosen}.values())
    predicted = estimated_returned(decision.forward, cpu, not_returned=set(decision.chosen)) + copies
    assert predicted == estimated_returned(thunder.last_traces(jitted)[-1], cpu)

"""Thunder's tensor-parallel transforms on CUDA, held to eager PyTorch: a probe for the GPU
machine (docs/gpu-runs.md), not part of the suite. Thunder pins TP to ``cuda:<rank>``
(``column_parallel``/``row_parallel`` take the device from the rank), so no CPU run reaches it.

Run under torchrun: ``torchrun --nproc-per-node 1 tools/gpu/tp_probe.py``. For each
composition it prints the forward and gradient differences from eager at the full weights
(with one rank every shard is the whole weight, so they must agree to the dtype's rounding)
and the collectives in Thunder's final forward and backward traces, read from bound symbols.
Exit status 1 when any composition disagrees with eager or raises."""

from __future__ import annotations

import copy
import sys
import traceback

import thunder
import torch
import torch.distributed as dist
import torch.nn.functional as F
from thunder.distributed import column_parallel, row_parallel
from torch import nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 32)
        self.l1 = nn.Linear(32, 64)
        self.l2 = nn.Linear(64, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.l2(F.gelu(self.l1(self.embed(tokens)), approximate="tanh"))


# (name, [(transform, target modules), ...]) applied in order to jit(model)
COMPOSITIONS = [
    ("column(embed,l2)", [(column_parallel, ("embed", "l2"))]),
    ("row(l1,l2)", [(row_parallel, ("l1", "l2"))]),
    ("column(l1)+row(l2)", [(column_parallel, ("l1",)), (row_parallel, ("l2",))]),
]
COLLECTIVE_WORDS = ("all_gather", "all_reduce", "reduce_scatter", "broadcast", "wait", "synchronize")


def collectives(trace) -> list[str]:
    """Names of the collective symbols a trace binds, subsymbols of fusions included."""
    names = []
    stack = list(trace.bound_symbols)
    while stack:
        b = stack.pop(0)
        name = b.sym.name
        if any(w in name for w in COLLECTIVE_WORDS) and name != "broadcast_in_dim":  # a shape op
            names.append(name)
        stack[:0] = list(b.subsymbols)
    return names


def main() -> int:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    torch.manual_seed(0)
    reference = Model().to(device)
    tokens = torch.randint(0, 16, (4, 6), device=device)
    failed = 0
    for name, steps in COMPOSITIONS:
        try:
            model = copy.deepcopy(reference)
            eager = copy.deepcopy(reference)
            tm = thunder.jit(model)
            for transform, targets in steps:
                tm = transform(tm, target_modules=targets)
            out = tm(tokens)
            out.sum().backward()
            want = eager(tokens)
            want.sum().backward()
            forward_diff = (out - want).abs().max().item()
            grads = {n: p.grad for n, p in tm.named_parameters()}
            grad_diff = max((grads[n] - p.grad).abs().max().item() for n, p in eager.named_parameters())
            torch.testing.assert_close(out, want)
            for n, p in eager.named_parameters():
                torch.testing.assert_close(grads[n], p.grad, msg=lambda m, n=n: f"{n}: {m}")
            fw = collectives(thunder.last_traces(tm)[-1])
            bw = collectives(thunder.last_backward_traces(tm)[-1])
            print(f"TP {name}: conforms; max |out-eager| {forward_diff:.3g}, max |grad-eager| {grad_diff:.3g}; "
                  f"forward collectives {fw}; backward {bw}", flush=True)
        except Exception as e:  # a probe: report each composition, go on to the next
            failed += 1
            print(f"TP {name}: FAILED {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

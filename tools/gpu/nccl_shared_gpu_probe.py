"""Can two ranks share one GPU under NCCL? A probe for the GPU machine (docs/gpu-runs.md):
``torchrun --nproc-per-node 2 tools/gpu/nccl_shared_gpu_probe.py`` puts both ranks on
``cuda:0`` and all-reduces one tensor. NCCL is expected to refuse (a duplicate GPU); the probe
prints what it did, so the kit's one-GPU plan (NCCL worlds of one rank) rests on a measurement."""

from __future__ import annotations

import torch
import torch.distributed as dist

dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
rank = dist.get_rank()
x = torch.full((4,), float(rank + 1), device="cuda:0")
try:
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"rank {rank}: all_reduce on a shared GPU gave {x.tolist()} (expected [3.0]*4)", flush=True)
finally:
    dist.destroy_process_group()

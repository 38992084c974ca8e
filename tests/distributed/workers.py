"""Worker processes of the distributed tests: each rank trains the same model in eager and
compiled by kiln, side by side, and rank 0 writes what the test checks to a JSON file."""

from __future__ import annotations

import copy
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width: int = 32, depth: int = 3):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.out = nn.Linear(width, 4)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def _wrap(kind: str, model: nn.Module, world: int) -> nn.Module:
    if kind.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, bucket_cap_mb=1)
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for b in model.blocks:
            fully_shard(b)
        return fully_shard(model)
    if kind == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        return parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    raise ValueError(kind)


def _model(kind: str) -> nn.Module:
    if kind == "tp":
        return Block(32)
    if kind == "ddp_buckets":  # 4 MiB of parameters: several 1 MiB buckets
        return Net(width=256, depth=4)
    return Net()


def train(rank: int, world: int, kind: str, port: int, out: str, steps: int = 3) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import kiln
    from kiln import errors
    from kiln.frontend.backend import REPORTS

    torch.manual_seed(0)
    base = _model(kind)
    runs = []
    for compiled in (False, True):
        model = _wrap(kind, copy.deepcopy(base), world)
        if compiled:
            model = kiln.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(steps):
            torch.manual_seed(100 + step * world + (0 if kind == "tp" else rank))
            x = torch.randn(8, base.inp.in_features if hasattr(base, "inp") else 32)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        params = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
                  for p in model.parameters()]
        runs.append((losses, params))
    (eager_losses, eager_params), (kiln_losses, kiln_params) = runs
    result = {
        "eager_losses": eager_losses,
        "kiln_losses": kiln_losses,
        "param_diff": max((a - b).abs().max().item() for a, b in zip(eager_params, kiln_params)),
        "graphs": len(REPORTS),
        "internal": [str(f) for f in errors.FALLBACKS if f.kind == "internal" or f.scope == "graph"],
    }
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    # ranks leave together: gloo aborts a rank whose peers closed their connections first
    dist.barrier()
    dist.destroy_process_group()

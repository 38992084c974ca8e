"""kiln under data and model parallelism, with several processes on the CPU (gloo): DDP,
FSDP2 and a tensor-parallel block train like eager, and kiln compiles the expected graphs."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from workers import train

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(kind: str, world: int, tmp_path) -> dict:
    out = str(tmp_path / f"{kind}.json")
    mp.spawn(train, args=(world, kind, _free_port(), out), nprocs=world)
    with open(out) as f:
        return json.load(f)


def check_like_eager(result: dict) -> None:
    torch.testing.assert_close(result["kiln_losses"], result["eager_losses"], rtol=1e-5, atol=1e-6)
    assert result["param_diff"] < 1e-5, result
    assert not result["internal"], result["internal"]


# (kind, processes, forward + backward graphs kiln compiles in rank 0)
CASES = [
    ("ddp", 2, 2),
    ("ddp", 4, 2),
    ("fsdp", 2, 2),  # the three blocks share one compiled forward and backward
    ("fsdp", 4, 2),
    ("tp", 2, 2),
]


@pytest.mark.parametrize("kind,world,graphs", CASES, ids=[f"{k}-{w}" for k, w, _ in CASES])
def test_trains_like_eager(kind, world, graphs, tmp_path):
    result = run(kind, world, tmp_path)
    check_like_eager(result)
    assert result["graphs"] == graphs, result


def test_ddp_graphs_split_at_gradient_buckets(tmp_path):
    """Dynamo splits the inner model's graph where DDP's 1 MiB buckets end, so each bucket's
    all-reduce can start while the backward of the layers below runs."""
    result = run("ddp_buckets", 2, tmp_path)
    check_like_eager(result)
    assert result["graphs"] > 2, result

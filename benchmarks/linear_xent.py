"""Linear + cross-entropy, forward and backward: kiln (chunked), eager and Inductor in one
process. `python -m benchmarks.linear_xent [--device cuda] [--dtype bf16] [--shape N,H,V]`.

The issue's case is `--device cuda --dtype bf16 --shape 8192,768,50304`. Reports the time of a
step (median of calls taken in turns), and on CUDA the peak memory above the inputs."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch
import torch.nn.functional as F

from benchmarks.measure import time_interleaved


def loss_and_grads(x, w, targets):
    loss = F.cross_entropy((x @ w.t()).float(), targets)
    loss.backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    return loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--shape", default="2048,256,32768", help="N,H,V")
    parser.add_argument("--repeat", type=int, default=10)
    parsed = parser.parse_args(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
    import kiln

    n, h, v = (int(s) for s in parsed.shape.split(","))
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[parsed.dtype]
    x = torch.randn(n, h, device=parsed.device, dtype=dtype, requires_grad=True)
    w = (torch.randn(v, h, device=parsed.device, dtype=dtype) / h**0.5).requires_grad_()
    targets = torch.randint(0, v, (n,), device=parsed.device)
    variants = {"eager": loss_and_grads, "inductor": torch.compile(loss_and_grads),
                "kiln": kiln.compile(loss_and_grads)}
    losses = {name: fn(x, w, targets).item() for name, fn in variants.items()}
    samples = time_interleaved(variants, (x, w, targets), parsed.repeat)
    print(f"x {n}x{h} @ w {v}x{h} {parsed.dtype} on {parsed.device}; logits "
          f"{n * v * dtype.itemsize / 2**30:.2f} GiB; losses {losses}")
    print("| variant | step ms | peak GiB above inputs |")
    print("|---|---|---|")
    for name, fn in variants.items():
        peak = ""
        if parsed.device == "cuda":
            x.grad = w.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn(x, w, targets)
            peak = f"{(torch.cuda.max_memory_allocated() - base) / 2**30:.2f}"
        print(f"| {name} | {statistics.median(samples[name]) * 1e3:.2f} | {peak} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

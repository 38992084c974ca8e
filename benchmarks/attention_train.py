"""Written-out causal attention, a training step (forward + backward): kiln, eager and
Inductor in one process. `python -m benchmarks.attention_train [--device cuda] [--dtype bf16]`.

Reports the step time (median of calls taken in turns), the bytes the forward saves for the
backward (kiln's partition; written out, the [B, H, T, T] probabilities are among them) and,
on CUDA, the peak memory of a step."""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

from benchmarks.measure import time_interleaved


class Attention(torch.nn.Module):
    def __init__(self, t: int):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, q, k, v):
        t = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (k.size(-1) ** -0.5)
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        return (torch.softmax(att, dim=-1) @ v).sum()


def step(model, q, k, v):
    loss = model(q, k, v)
    loss.backward()
    if q.is_cuda:
        torch.cuda.synchronize()
    return loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--shape", default="4,12,512,64", help="B,H,T,D")
    parser.add_argument("--repeat", type=int, default=10)
    parsed = parser.parse_args(argv)
    import os

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
    import kiln
    from kiln.frontend.backend import REPORTS

    b, h, t, d = (int(x) for x in parsed.shape.split(","))
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[parsed.dtype]
    qkv = [torch.randn(b, h, t, d, device=parsed.device, dtype=dtype, requires_grad=True) for _ in range(3)]
    model = Attention(t).to(parsed.device)
    variants = {"eager": model, "inductor": torch.compile(model), "kiln": kiln.compile(model)}
    steps = {name: (lambda m: lambda *a: step(m, *a))(m) for name, m in variants.items()}
    for name, fn in steps.items():
        fn(*qkv)  # compile
    saved = sum(r.partition.saved_bytes for r in REPORTS if r.partition is not None)
    samples = time_interleaved(steps, tuple(qkv), parsed.repeat)
    print(f"shape {parsed.shape} {parsed.dtype} on {parsed.device}; probabilities "
          f"{b * h * t * t * dtype.itemsize / 2**20:.1f} MiB; kiln saves {saved / 2**20:.1f} MiB")
    print("| variant | step ms | peak MiB |")
    print("|---|---|---|")
    for name, fn in steps.items():
        peak = ""
        if parsed.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            fn(*qkv)
            torch.cuda.synchronize()
            peak = f"{torch.cuda.max_memory_allocated() / 2**20:.0f}"
        print(f"| {name} | {statistics.median(samples[name]) * 1e3:.2f} | {peak} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A training step with dropout everywhere: an encoder-decoder-like stack (self-attention with
an additive attention bias, cross-attention, MLP, LayerNorm; dropout on the attention
probabilities and on every residual branch), forward + backward. Eager, Inductor, kiln and
kiln with eager_random=True (the random ops left to ATen) in one process, taken in turns.

    python -m benchmarks.dropout_train --device cuda --dtype bf16

Reports the step time (median), the peak memory of a step on CUDA and the bytes kiln's
forward graphs save for their backward (with in-kernel random numbers no dropout mask is saved)."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch
import torch.nn.functional as F

from benchmarks.measure import time_interleaved


class Attention(torch.nn.Module):
    def __init__(self, d: int, heads: int, p: float):
        super().__init__()
        self.heads, self.p = heads, p
        self.q, self.kv, self.out = (torch.nn.Linear(d, d), torch.nn.Linear(d, 2 * d), torch.nn.Linear(d, d))

    def forward(self, x, memory, bias):
        b, t, d = x.shape
        h = self.heads
        q = self.q(x).view(b, t, h, d // h).transpose(1, 2)
        k, v = self.kv(memory).view(b, memory.size(1), 2, h, d // h).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) * (d // h) ** -0.5 + bias  # additive attention bias
        probs = F.dropout(torch.softmax(scores.float(), dim=-1).to(q.dtype), self.p, self.training)
        return self.out((probs @ v).transpose(1, 2).reshape(b, t, d))


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int, p: float, cross: bool):
        super().__init__()
        self.p = p
        self.attn, self.norm1 = Attention(d, heads, p), torch.nn.LayerNorm(d)
        self.cross = Attention(d, heads, p) if cross else None
        self.norm2 = torch.nn.LayerNorm(d) if cross else None
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Dropout(p),
                                       torch.nn.Linear(4 * d, d))
        self.norm3 = torch.nn.LayerNorm(d)

    def forward(self, x, memory, bias):
        x = self.norm1(x + F.dropout(self.attn(x, x, bias), self.p, self.training))
        if self.cross is not None:
            x = self.norm2(x + F.dropout(self.cross(x, memory, 0.0), self.p, self.training))
        return self.norm3(x + F.dropout(self.mlp(x), self.p, self.training))


class EncoderDecoder(torch.nn.Module):
    def __init__(self, d: int, heads: int, layers: int, t: int, p: float):
        super().__init__()
        self.encoder = torch.nn.ModuleList(Block(d, heads, p, False) for _ in range(layers))
        self.decoder = torch.nn.ModuleList(Block(d, heads, p, True) for _ in range(layers))
        self.bias = torch.nn.Parameter(torch.randn(1, heads, t, t) * 0.1)  # a learned position bias

    def forward(self, src, tgt):
        memory = src
        for block in self.encoder:
            memory = block(memory, memory, self.bias)
        x = tgt
        for block in self.decoder:
            x = block(x, memory, self.bias)
        return x.float().square().mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    parser.add_argument("--shape", default="16,256,512,8,3", help="batch,T,d,heads,layers")
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=20)
    parsed = parser.parse_args(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
    import kiln
    from kiln.frontend.backend import REPORTS

    batch, t, d, heads, layers = (int(x) for x in parsed.shape.split(","))
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[parsed.dtype]
    torch.manual_seed(0)
    model = EncoderDecoder(d, heads, layers, t, parsed.p).to(parsed.device, dtype).train()
    src, tgt = (torch.randn(batch, t, d, device=parsed.device, dtype=dtype) for _ in range(2))
    variants = {
        "eager": model,
        "inductor": torch.compile(model),
        "kiln": kiln.compile(model),
        "kiln eager_random": kiln.compile(model, eager_random=True),
    }

    def stepper(m):
        def step(src, tgt):
            model.zero_grad(set_to_none=True)
            m(src, tgt).backward()
            if src.is_cuda:
                torch.cuda.synchronize()
        return step

    steps = {name: stepper(m) for name, m in variants.items()}
    saved = {}
    for name, fn in steps.items():
        before = len(REPORTS)
        fn(src, tgt)  # compile
        saved[name] = sum(r.partition.saved_bytes for r in REPORTS[before:] if r.partition is not None)
    samples = time_interleaved(steps, (src, tgt), parsed.repeat)
    print(f"encoder-decoder {parsed.shape} (batch,T,d,heads,layers) {parsed.dtype} p={parsed.p} "
          f"on {parsed.device}; median of {parsed.repeat} steps taken in turns")
    print("| variant | step ms | vs eager | peak MiB | saved for backward MiB |")
    print("|---|---|---|---|---|")
    eager_ms = statistics.median(samples["eager"]) * 1e3
    for name, fn in steps.items():
        peak = ""
        if parsed.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            fn(src, tgt)
            torch.cuda.synchronize()
            peak = f"{torch.cuda.max_memory_allocated() / 2**20:.0f}"
        ms = statistics.median(samples[name]) * 1e3
        kept = f"{saved[name] / 2**20:.1f}" if name.startswith("kiln") else ""
        print(f"| {name} | {ms:.2f} | {eager_ms / ms:.2f}x | {peak} | {kept} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

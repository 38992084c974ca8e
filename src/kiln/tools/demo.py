"""`python -m kiln demo`: compile a small transformer block, check it against eager, time
both, and show what fused and what ran in ATen."""

from __future__ import annotations

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """Pre-norm transformer block: RMSNorm, causal attention, RMSNorm, SwiGLU MLP."""

    def __init__(self, dim: int = 256, heads: int = 4, hidden: int = 704):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _median_ms(fn, x, repeat: int = 20) -> float:
    for _ in range(3):
        fn(x)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> int:
    import kiln
    from kiln.frontend.backend import REPORTS
    from kiln.passes.cost import break_even
    from kiln.passes.roofline import Ceilings
    from kiln.tools.explain import explained_graph

    Ceilings.for_device(torch.device("cpu"))  # once per machine, kept out of the timed compile
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(8, 128, 256)
    with torch.no_grad():
        expected = model(x)
        t0 = time.perf_counter()
        compiled = kiln.compile(model)
        actual = compiled(x)
        compile_s = time.perf_counter() - t0
        err = (actual - expected).abs().max().item()
        ok = torch.allclose(actual, expected, rtol=1e-4, atol=1e-4)
        eager_ms, kiln_ms = _median_ms(model, x), _median_ms(compiled, x)
    report = REPORTS[-1]
    print("kiln demo: pre-norm transformer block (RMSNorm, causal attention, SwiGLU), "
          "x = [8, 128, 256] float32\n")
    print(explained_graph(report, show_kernels=False))
    print(f"\nmatches eager: {'yes' if ok else 'NO'} (max abs error {err:.2e})")
    print(
        f"first call (compile + run): {compile_s:.2f} s; "
        f"kernels compiled {report.num_kernels - report.cache_hits}, from cache {report.cache_hits}"
    )
    print(f"eager {eager_ms:.2f} ms, kiln {kiln_ms:.2f} ms: {eager_ms / kiln_ms:.2f}x")
    measured = break_even(compile_s - kiln_ms / 1e3, eager_ms / 1e3, kiln_ms / 1e3, measured=True)
    print(measured.text(of="first call: Dynamo, AOTAutograd and kiln"))
    return 0 if ok else 1

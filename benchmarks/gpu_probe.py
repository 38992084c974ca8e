"""Where a memory-bound kernel's time goes, on an NVIDIA GPU: a wide sweep of launch
configurations for each kernel of a case, and source variants that leave one part of the
work out (so the difference is that part's cost).

    PYTHONPATH=src python -m benchmarks.gpu_probe [--cases layernorm,softmax]

For each case: the time of a device copy of the same bytes (the best this traffic can do),
then per kernel every configuration's time (kiln's autotuner, timed more than usual) and
per variant the best configuration's time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import gpu

# name -> (cases it applies to, textual edit of the generated source, what the difference measures)
VARIANTS = {
    "as generated": ("", lambda s: s, ""),
    "no erf": ("layernorm", lambda s: s.replace("km.erf_f32(", "("), "erf's cost"),
    "libdevice erf": ("layernorm", lambda s: s.replace("km.erf_f32(", "tl.erf("), "libdevice's erf"),
    "no tanh": ("gelu tanh", lambda s: s.replace("km.tanh(", "("), "tanh's cost"),
    "no bf16 rounding": ("layernorm", lambda s: s.replace("km.round_bf16(", "("), "bf16 rounding of intermediates"),
}


def sweep(kernel) -> list[tuple[int, int, int]]:
    from kiln.codegen.triton_launch import candidate_configs, is_persistent, next_pow2

    if not kernel.reduce:
        return [(x, 1, w) for x in (256, 512, 1024, 2048, 4096) for w in (2, 4, 8)]
    if is_persistent(kernel):
        rblock = next_pow2(kernel.reduce_numel)
        return [(x, rblock, w) for x in (1, 2, 4, 8, 16) if x * rblock <= 32768 for w in (1, 2, 4, 8, 16)
                if 32 * w <= x * rblock]
    return candidate_configs(kernel)


def probe_case(name, fn, args, moved, variants) -> list[str]:
    import kiln
    import kiln.codegen.triton as tr
    import kiln.codegen.triton_launch as triton_launch

    lines = []
    t_copy = gpu.copy_time(moved)
    lines.append(f"## {name}: {moved / 1e6:.0f} MB; a copy of as many bytes takes {t_copy * 1e3:.4f} ms")
    original_render, original_candidates = tr.render_source, triton_launch.candidate_configs
    for variant, (cases, edit, meaning) in VARIANTS.items():
        if cases not in name or variant not in variants:
            continue
        cache = tempfile.mkdtemp(prefix="probe-")
        os.environ["KILN_CACHE_DIR"] = cache
        tr.render_source = lambda kern, edit=edit: edit(original_render(kern))
        triton_launch.candidate_configs = sweep
        try:
            torch._dynamo.reset()
            compiled = kiln.compile(fn, mode="max-autotune")
            with torch.no_grad():
                compiled(*args)
            t = gpu.bench(compiled, args)
        finally:
            tr.render_source, triton_launch.candidate_configs = original_render, original_candidates
        lines.append(f"- {variant}: {t * 1e3:.4f} ms = {moved / t / 1e12:.2f} TB/s, copy/this "
                     f"{t_copy / t:.2f} {('(' + meaning + ')') if meaning else ''}")
        if variant == "as generated":
            for record in sorted(Path(cache).glob("triton/*.tune.json")):
                ms = json.loads(record.read_text())["ms"]
                ranked = sorted(ms.items(), key=lambda kv: kv[1])
                lines.append(f"  - {record.stem.split('.')[0]} configs, fastest first: "
                             + ", ".join(f"{c} {v * 1e3:.1f}us" for c, v in ranked[:8])
                             + f" ... slowest {ranked[-1][0]} {ranked[-1][1] * 1e3:.1f}us")
    return lines


def loss_gradient(logits, row_max, row_log_sum, target, scale):
    """A cross-entropy gradient over a vocabulary, as a training backward computes it."""
    p = torch.exp(logits.float() - row_max[:, None] - row_log_sum[:, None])
    hot = torch.arange(logits.shape[1], device=logits.device)[None, :] == target[:, None]
    return (torch.where(hot, -scale, 0.0) + p * scale).to(logits.dtype)


def gelu_tanh(x):
    """GPT-2's GELU (transformers' gelu_new), written out with tanh."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def extra_cases():
    """Kernels of GPT-2's training step that gpu.py does not time (name, fn, args, bytes)."""
    logits = torch.randn(16384, 50304, device="cuda", dtype=torch.bfloat16)
    rows = torch.randn(16384, device="cuda")
    target = torch.randint(0, 50304, (16384,), device="cuda")
    yield ("loss gradient 16384x50304 bf16", loss_gradient,
           (logits, rows, rows.abs(), target, torch.tensor(1e-4, device="cuda")), 2 * logits.nbytes)
    h = torch.randn(16384, 3072, device="cuda", dtype=torch.bfloat16)
    yield "gelu tanh 16384x3072 bf16", gelu_tanh, (h,), 2 * h.nbytes


def host_overhead() -> list[str]:
    """Per-call time of tiny calls launched back to back: the host's cost per call."""
    import time

    import kiln

    lines = []
    compilers = {"eager": lambda f: f, "inductor": torch.compile, "kiln": kiln.compile}
    for case, fn, x in (("8x128 softmax", gpu.softmax, torch.randn(8, 128, device="cuda")),
                        ("tiny mlp 32x64", gpu.TinyMLP().cuda(), torch.randn(32, 64, device="cuda"))):
        lines.append(f"## host time per call ({case}, 2000 calls back to back)")
        for name, compile_fn in compilers.items():
            torch._dynamo.reset()
            compiled = compile_fn(fn)
            with torch.no_grad():
                for _ in range(20):
                    compiled(x)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(2000):
                    compiled(x)
                torch.cuda.synchronize()
            lines.append(f"- {name}: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="host,layernorm,softmax,rmsnorm,odd,loss,gelu")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="source variants to time")
    args = parser.parse_args()
    variants = args.variants.split(",")
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    out = host_overhead() if "host" in wanted else []
    cases = [(name, fn, fargs, moved) for name, fn, fargs, moved, _, _ in gpu.cases()] + list(extra_cases())
    for name, fn, fargs, moved in cases:
        if moved and any(w in name for w in wanted):
            out += probe_case(name, fn, fargs, moved, variants)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

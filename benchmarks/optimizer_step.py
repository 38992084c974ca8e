"""A compiled AdamW step over GPT-2 124M's parameter shapes: eager (foreach), eager (fused,
CUDA only), Inductor and kiln side by side in one process.

    PYTHONPATH=src python -m benchmarks.optimizer_step --device cpu  [--layers 12] [--rounds 10]
    PYTHONPATH=src python -m benchmarks.optimizer_step --device cuda [--dtype bfloat16]

The shapes come from transformers' GPT2Config (no download), or from the same numbers written
out when transformers is missing. Each variant holds its own parameters, gradients and states;
the compiled steps are checked against eager's after the warm-up steps, then every variant is
timed in turns (one step each per round) and the median is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

_CACHES = (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
           ("TRITON_CACHE_DIR", "triton"))
for var, prefix in _CACHES:
    os.environ.setdefault(var, tempfile.mkdtemp(prefix=f"optim-bench-{prefix}-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def gpt2_shapes(layers: int | None = None) -> list[tuple[int, ...]]:
    """The parameter shapes of GPT2LMHeadModel (the head is tied to the embedding)."""
    try:
        from transformers import GPT2Config

        c = GPT2Config()
        d, n_layer, vocab, positions, inner = c.n_embd, c.n_layer, c.vocab_size, c.n_positions, c.n_inner
    except ImportError:
        d, n_layer, vocab, positions, inner = 768, 12, 50257, 1024, None
    inner = inner or 4 * d
    attention = [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,)]  # ln_1, c_attn, c_proj
    mlp = [(d,), (d,), (d, inner), (inner,), (inner, d), (d,)]  # ln_2, c_fc, c_proj
    block = attention + mlp
    return [(vocab, d), (positions, d)] + block * (n_layer if layers is None else layers) + [(d,), (d,)]


def make_params(shapes, device, dtype) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    params = []
    for k, shape in enumerate(shapes):
        p = torch.nn.Parameter((torch.randn(shape, generator=g) * 0.02).to(device, dtype))
        p.grad = (torch.randn(shape, generator=g) * 0.01).to(device, dtype)
        params.append(p)
    return params


def make_variant(name: str, shapes, device, dtype):
    params = make_params(shapes, device, dtype)
    kwargs = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    if name == "eager fused":
        opt = torch.optim.AdamW(params, fused=True, **kwargs)
        return params, opt, opt.step
    opt = torch.optim.AdamW(params, foreach=True, **kwargs)
    if name == "eager foreach":
        return params, opt, opt.step
    if name == "inductor":
        return params, opt, torch.compile(opt.step)
    if name == "kiln":
        import kiln

        return params, opt, kiln.compile(opt.step)
    raise ValueError(name)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def profile(variants, names, device) -> None:
    """Host time per step (the call's return, the device not awaited: a step whose host time
    is its whole time is launch-bound) and, on a GPU, time per kernel."""
    for name in names:
        step = variants[name][2]
        host = []
        for _ in range(5):
            sync(device)
            t0 = time.perf_counter()
            step()
            host.append(time.perf_counter() - t0)
        sync(device)
        print(f"\n{name}: host time per step {statistics.median(host) * 1e3:.2f} ms")
        if device.type == "cuda":
            from benchmarks.gpu_profile import print_profile

            print_profile(name, step, top=12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--layers", type=int, default=None, help="transformer blocks (default: GPT-2's 12)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--variants", default="eager foreach,eager fused,inductor,kiln")
    ap.add_argument("--profile", action="store_true",
                    help="print each variant's host time per step and, on a GPU, its kernels")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    shapes = gpt2_shapes(args.layers)
    numel = sum(torch.Size(s).numel() for s in shapes)
    names = [v for v in args.variants.split(",") if v != "eager fused" or device.type == "cuda"]
    print(f"AdamW over {len(shapes)} tensors, {numel / 1e6:.1f}M {args.dtype} parameters on {device} "
          f"({torch.get_num_threads()} threads), torch {torch.__version__}")

    variants, first = {}, {}
    for name in names:
        variants[name] = make_variant(name, shapes, device, dtype)
        step = variants[name][2]
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        first[name] = time.perf_counter() - t0
        print(f"  {name:<14} first step {first[name]:.1f} s", flush=True)
        for _ in range(2):
            step()
    sync(device)
    reference = variants[names[0]][0]
    for name in names[1:]:
        err = max((p - r).abs().max().item() for p, r in zip(variants[name][0], reference))
        print(f"  {name:<14} max |param - {names[0]}| after 3 steps: {err:.2e}")

    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            step = variants[name][2]
            sync(device)
            t0 = time.perf_counter()
            step()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times[names[0]])
    moved = numel * torch.finfo(dtype).bits // 8 * 7  # param, grad, 2 states read; 3 written
    print(f"\n| variant | ms per step | vs {names[0]} | GB/s (7 passes) | first step s |")
    print("|---|---|---|---|---|")
    for name in names:
        t = statistics.median(times[name])
        print(f"| {name} | {t * 1e3:.2f} | {base / t:.2f}x | {moved / t / 1e9:.1f} | {first[name]:.1f} |")
    if args.profile:
        profile(variants, names, device)
    if "kiln" in names:
        import kiln

        print("\n" + str(kiln.stats()))


if __name__ == "__main__":
    main()

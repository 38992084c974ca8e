"""Real models on an NVIDIA GPU: eager vs Inductor vs kiln in one process.

    PYTHONPATH=src python -m benchmarks.gpu_models [--models resnet50,convnext_tiny] [--batch 64]

timm models with random weights, inference, bf16 autocast, channels_last inputs and weights.
Per model and variant: the first call (compile included), the median time of a call measured
with CUDA events over back-to-back calls (after warm-up), peak memory, and the largest
difference of the logits from eager's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

for var, prefix in (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                    ("TRITON_CACHE_DIR", "triton")):
    os.environ.setdefault(var, tempfile.mkdtemp(prefix=f"gpu-models-{prefix}-"))

import torch  # noqa: E402

from benchmarks.gpu_profile import name_kernels_by_graph, print_profile, write_explain  # noqa: E402


def _timed(fn, x, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(calls):
        start.record()
        fn(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(name: str, batch: int, variants: list[str], calls: int, profile: bool = False) -> list[dict]:
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).cuda().eval().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    rows, reference = [], None
    for variant in variants:
        torch._dynamo.reset()
        if variant == "kiln":
            import kiln

            if profile:
                name_kernels_by_graph()
            fn = kiln.compile(model)
        elif variant == "inductor":
            fn = torch.compile(model)
        else:
            fn = model

        def call(inp, fn=fn):
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                return fn(inp)

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = call(x).float()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        for _ in range(5):
            call(x)
        ms = _timed(call, x, calls)
        if profile:
            print_profile(f"{name} {variant}", lambda: call(x), top=None)
        reference = out if reference is None else reference
        rows.append({"model": name, "variant": variant, "ms": ms, "first_s": first,
                     "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                     "max_diff": (out - reference).abs().max().item()})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,convnext_tiny")
    p.add_argument("--variants", default="eager,inductor,kiln")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--profile", action="store_true", help="print GPU time per kernel")
    p.add_argument("--explain", default="", help="write kiln's account of each graph to this folder")
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}, bf16 autocast, "
          "channels_last, inference")
    print(f"{'model':<16} {'variant':<9} {'ms':>8} {'first s':>8} {'peak GiB':>9} {'max |diff|':>11}")
    for name in args.models.split(","):
        for r in run(name, args.batch, args.variants.split(","), args.calls, args.profile):
            print(f"{r['model']:<16} {r['variant']:<9} {r['ms']:8.2f} {r['first_s']:8.1f} "
                  f"{r['peak_gib']:9.2f} {r['max_diff']:11.4f}")
    if args.explain:
        write_explain(args.explain)


if __name__ == "__main__":
    main()

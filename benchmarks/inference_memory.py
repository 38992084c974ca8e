"""Peak memory of a conv net's inference call: eager vs Inductor vs kiln, in one process.

    PYTHONPATH=src python -m benchmarks.inference_memory                   # batch 8, float32, CPU
    PYTHONPATH=src python -m benchmarks.inference_memory --no-arena        # kiln's CUDA plan, on the CPU
    PYTHONPATH=src python -m benchmarks.inference_memory --device cuda     # batch 64, bf16 autocast

The model is transformers' ResNet-50 (ResNetConfig's defaults, random weights, no download) in
channels_last. The peak is what a warm call allocates on top of what was held before it, measured
as benchmarks/train_memory.py measures a training step's (kiln's CPU arena added); each result is
checked against eager's.
"""

from __future__ import annotations

import argparse
import copy

import torch

# importing it points the compilers' caches at empty folders
from benchmarks.train_memory import _cpu_peak, use_cuda_memory_plan


def peak_of(call, device: str) -> int:
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from kiln.runtime import host_ops

    return _cpu_peak(call) + host_ops.shared_arena_bytes()


def run(variant: str, base, x, dtype, device: str) -> tuple[int, float, list]:
    import kiln
    from kiln.frontend.backend import REPORTS
    from kiln.passes.peak import step_peak

    model = copy.deepcopy(base)
    torch._dynamo.reset()
    fn = {"eager": model, "inductor": torch.compile(model), "kiln": kiln.compile(model)}[variant]

    def call():
        with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            return fn(pixel_values=x).last_hidden_state

    with REPORTS.collect() as reports:
        out = call()
    call()
    with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
        expected = base(pixel_values=x).last_hidden_state
    diff = (out.float() - expected.float()).abs().max().item()
    predicted = [p for p in [step_peak(reports)] if p is not None] if variant == "kiln" else []
    return peak_of(call, device), diff, predicted


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=0, help="default: 8 on the CPU, 64 on CUDA")
    parser.add_argument("--variants", default="eager,inductor,kiln")
    parser.add_argument("--no-arena", action="store_true",
                        help="plan kiln's temporaries as on CUDA, to measure that plan on the CPU")
    args = parser.parse_args()
    if args.no_arena:
        use_cuda_memory_plan()
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    base = ResNetModel(ResNetConfig()).eval().to(args.device, memory_format=torch.channels_last)
    batch = args.batch or (64 if args.device == "cuda" else 8)
    x = torch.randn(batch, 3, 224, 224, device=args.device).to(memory_format=torch.channels_last)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    print(f"ResNet-50, batch {batch}, channels_last, {args.device}, autocast {dtype}")
    for variant in args.variants.split(","):
        peak, diff, predicted = run(variant, base, x, dtype, args.device)
        print(f"{variant:9} peak {peak / 2**20:8.1f} MiB  max |diff| {diff:.2e}")
        for p in predicted:
            print(f"{'':9} kiln's analysis: peak {p.nbytes / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPT-2 (124M) training step on an NVIDIA GPU: eager vs Inductor vs kiln in one process.

    PYTHONPATH=src python -m benchmarks.gpu_train [--batch 16] [--seq 1024] [--steps 10]

bf16 autocast, fused AdamW, random weights and tokens. Reports tokens/s, the first step
(compile included) and peak memory, and checks that the first losses agree with eager.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time

for var, prefix in (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
    os.environ[var] = tempfile.mkdtemp(prefix=f"gpu-train-{prefix}-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.gpu_profile import name_kernels_by_graph, print_profile, write_explain  # noqa: E402


def make_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50304, n_positions=1024,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).cuda().train()


def run(variant: str, base, batches, steps: int, profile: bool = False):
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    torch._dynamo.reset()
    if variant == "inductor":
        fwd = torch.compile(model)
    elif variant.startswith("kiln"):
        import kiln

        if profile:
            name_kernels_by_graph()
        fwd = kiln.compile(model, mode="max-autotune" if variant == "kiln-autotune" else "default")
    else:
        fwd = model

    def step(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    losses = [step(batches[0]).item()]
    first = time.perf_counter() - t0
    for ids in batches[1:3]:
        losses.append(step(ids).item())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)])
    torch.cuda.synchronize()
    per_step = (time.perf_counter() - t0) / steps
    peak = torch.cuda.max_memory_allocated() / 2**30
    if profile:
        print_profile(variant, lambda: step(batches[0]))
    return {"losses": losses, "first": first, "step": per_step, "peak": peak}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--variants", default="eager,inductor,kiln")
    parser.add_argument("--profile", action="store_true", help="print GPU time per kernel")
    parser.add_argument("--explain", default="", help="write kiln's account of each graph to this folder")
    args = parser.parse_args()
    base = make_model()
    batches = [torch.randint(0, 50257, (args.batch, args.seq), device="cuda") for _ in range(4)]
    tokens = args.batch * args.seq
    results = {}
    for variant in args.variants.split(","):
        results[variant] = r = run(variant, base, batches, args.steps, args.profile)
        print(f"{variant}: {tokens / r['step']:.0f} tokens/s, step {r['step'] * 1e3:.1f} ms, first step "
              f"{r['first']:.1f} s, peak {r['peak']:.1f} GiB, losses {['%.4f' % x for x in r['losses']]}", flush=True)
    if args.explain:
        write_explain(args.explain)
    if "kiln-autotune" in results:
        sys.argv = ["tune_report", os.environ["KILN_CACHE_DIR"]]
        from benchmarks import tune_report

        tune_report.main()
    eager = results.get("eager")
    print("\n| variant | tokens/s | step ms | vs eager | first step (compile) s | peak GiB | loss step 1..3 |")
    print("|---|---|---|---|---|---|---|")
    for variant, r in results.items():
        speed = eager["step"] / r["step"] if eager else float("nan")
        print(f"| {variant} | {tokens / r['step']:.0f} | {r['step'] * 1e3:.1f} | {speed:.2f}x | {r['first']:.1f} | "
              f"{r['peak']:.1f} | {' '.join('%.4f' % x for x in r['losses'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

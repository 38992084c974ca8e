"""Peak memory and time of a training step (forward + backward): eager vs Inductor vs kiln, in one process.

    PYTHONPATH=src python -m benchmarks.train_memory                      # small configs, CPU
    PYTHONPATH=src python -m benchmarks.train_memory --device cuda --full  # GPT-2 124M, BERT-base

Models: transformers' GPT-2 (LM head, tied) and BERT (masked LM), random weights, no download.
The peak is what the step allocates on top of the memory held before it (parameters, batch):
on CUDA torch.cuda.max_memory_allocated; on the CPU the running sum of the allocations and
frees torch.profiler records (profile_memory=True). kiln's CPU arena persists across calls, so
the profiler of a warm step does not see it: its size is added to kiln's measured peak.
kiln's own analysis of the step (passes/peak.py) is printed next to the measurement.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

for var, prefix in (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
    os.environ.setdefault(var, tempfile.mkdtemp(prefix=f"train-memory-{prefix}-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def make_gpt2(full: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    size = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50304, n_positions=1024) if full else \
        dict(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=256)
    config = GPT2Config(**size, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    batch, seq = (16, 1024) if full else (4, 128)
    return GPT2LMHeadModel(config), (batch, seq, config.vocab_size)


def make_bert(full: bool):
    from transformers import BertConfig, BertForMaskedLM

    size = {} if full else dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                intermediate_size=512, vocab_size=1024)
    config = BertConfig(**size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    batch, seq = (32, 128) if full else (8, 64)
    return BertForMaskedLM(config), (batch, seq, config.vocab_size)


MODELS = {"gpt2": make_gpt2, "bert": make_bert}


def _cpu_peak(step) -> int:
    """The highest running sum of the allocations and frees the profiler saw during step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    running = peak = 0
    for _, delta in sorted(events, key=lambda e: e[0]):
        running += delta
        peak = max(peak, running)
    return peak


def run(variant: str, base, shape, device: str, dtype, steps: int, profile: bool = False) -> dict:
    import kiln
    from kiln.frontend.backend import REPORTS
    from kiln.passes.peak import step_peak
    from kiln.runtime import host_ops

    model = copy.deepcopy(base).to(device).train()
    torch._dynamo.reset()
    fwd = {"eager": model, "inductor": torch.compile(model) if variant == "inductor" else None,
           "kiln": kiln.compile(model) if variant == "kiln" else None}[variant]
    batch, seq, vocab = shape
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)

    def step():
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach()

    def clear():
        for p in model.parameters():
            p.grad = None

    with REPORTS.collect() as reports:
        loss = step().item()
    clear()
    step()
    clear()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
        clear()
    sync()
    per_step = (time.perf_counter() - t0) / steps
    if device == "cuda":
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        sync()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _cpu_peak(step) + host_ops.shared_arena_bytes()
    clear()
    if profile and device == "cuda":
        from benchmarks.gpu_profile import print_profile

        print_profile(variant, lambda: (step(), clear()), top=None)
    predicted = [p for p in [step_peak(reports)] if p is not None] if variant == "kiln" else []
    return {"loss": loss, "step": per_step, "peak": peak, "predicted": predicted}


def use_cuda_memory_plan() -> None:
    """Plan kiln's temporaries as on CUDA from now on (slots in their first temporary's memory,
    no arena kept across calls), to measure that plan on the CPU."""
    import functools

    from kiln.passes import memory, pipeline

    pipeline.plan_memory = functools.partial(memory.plan_memory, arena=False)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--full", action="store_true", help="GPT-2 124M at 16x1024, BERT-base at 32x128")
    parser.add_argument("--models", default="gpt2,bert")
    parser.add_argument("--variants", default="eager,inductor,kiln")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="", help="autocast dtype (default: bfloat16 on CUDA, none on CPU)")
    parser.add_argument("--explain", action="store_true", help="print kiln's analysis of the peak")
    parser.add_argument("--profile", action="store_true", help="print GPU time per kernel (CUDA)")
    parser.add_argument("--explain-dir", default="", help="write kiln's account of each graph to this folder")
    parser.add_argument("--no-arena", action="store_true",
                        help="plan kiln's temporaries as on CUDA (slots in the first temporary's memory, no "
                             "arena kept across calls), to measure that plan on the CPU")
    args = parser.parse_args()
    if args.no_arena:
        use_cuda_memory_plan()
    default = torch.bfloat16 if args.device == "cuda" else torch.float32
    dtype = getattr(torch, args.dtype) if args.dtype else default
    print(f"device {args.device}, autocast {dtype}, {'full' if args.full else 'small'} configs")
    print(f"{'model':6} {'variant':9} {'peak':>10} {'step':>10}  loss")
    for name in args.models.split(","):
        torch.manual_seed(0)
        base, shape = MODELS[name](args.full)
        for variant in args.variants.split(","):
            r = run(variant, base, shape, args.device, dtype, args.steps, args.profile)
            peak, ms = r["peak"] / 2**20, r["step"] * 1e3
            print(f"{name:6} {variant:9} {peak:8.2f} MiB {ms:7.2f} ms  {r['loss']:.5f}")
            for p in r["predicted"]:
                if args.explain:
                    print(p.text())
                else:
                    print(f"{'':16} kiln's analysis: peak {p.nbytes / 2**20:.2f} MiB in the {p.program}")
    if args.explain_dir:
        from benchmarks.gpu_profile import write_explain

        write_explain(args.explain_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

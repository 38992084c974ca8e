"""GPT-2 (124M) training with DDP or FSDP2 on several GPUs: eager vs Inductor vs kiln.

    torchrun --nproc-per-node 8 -m benchmarks.gpu_distributed --wrap ddp   [--steps 10]
    torchrun --nproc-per-node 8 -m benchmarks.gpu_distributed --wrap fsdp
    torchrun --nproc-per-node 2 -m benchmarks.gpu_distributed --wrap ddp --small   # CPU (gloo) check

Per rank: batch 16x1024 tokens (--batch, --seq), bf16 autocast and fused AdamW on the GPU,
random weights and tokens (the same on every rank for the model, different data per rank).
Rank 0 prints per variant: median step time, tokens/s across ranks, first step (compile
included), peak memory per GPU, and the first losses against eager's. Both compilers compile
inside the wrappers (the inner model under DDP, each transformer block under FSDP2), as
Dynamo cannot trace DDP's forward or FSDP2's hooks.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time

for var, prefix in (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                    ("TRITON_CACHE_DIR", "triton")):
    os.environ.setdefault(var, tempfile.mkdtemp(prefix=f"gpu-dist-{prefix}-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def make_model(small: bool, device: torch.device) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    size = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=128) if small else \
        dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50304, n_positions=1024)
    config = GPT2Config(**size, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).to(device).train()


def wrap(model: torch.nn.Module, how: str, device: torch.device) -> torch.nn.Module:
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for block in model.transformer.h:
        fully_shard(block)
    return fully_shard(model)


def compile_for(variant: str, model: torch.nn.Module, how: str) -> torch.nn.Module:
    if variant == "kiln":
        import kiln

        return kiln.compile(model)
    if variant == "inductor":
        modules = [model.module] if how == "ddp" else list(model.transformer.h)
        for m in modules:
            m.compile()
    return model


def run(variant: str, base, how: str, batches, device: torch.device, steps: int) -> dict:
    torch._dynamo.reset()
    model = compile_for(variant, wrap(copy.deepcopy(base), how, device), how)
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda, foreach=not cuda)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    times, losses = [], []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for i in range(steps):
        ids = batches[i % len(batches)]
        t0 = time.perf_counter()
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    return {"first": times[0], "step": statistics.median(times[2:] or times),
            "losses": [x.item() for x in losses[:3]], "peak_gib": peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--variants", default="eager,inductor,kiln")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--small", action="store_true", help="a tiny GPT-2 and batch, for a CPU check")
    args = p.parse_args()
    cuda = torch.cuda.is_available() and not args.small
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    batch, seq = (2, 64) if args.small else (args.batch, args.seq)
    base = make_model(args.small, device)
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    vocab = base.config.vocab_size
    batches = [torch.randint(0, vocab, (batch, seq), device=device, generator=gen) for _ in range(2)]
    results = {v: run(v, base, args.wrap, batches, device, args.steps) for v in args.variants.split(",")}
    if rank == 0:
        eager = results.get("eager")
        print(f"GPT-2 {'small' if args.small else '124M'} training, {args.wrap}, {world} ranks, "
              f"{batch}x{seq} tokens per rank, {torch.cuda.get_device_name(device) if cuda else 'CPU'}")
        print(f"{'variant':<10} {'step ms':>9} {'tokens/s':>11} {'first s':>8} {'peak GiB':>9}  losses")
        for v, r in results.items():
            tokens = batch * seq * world / r["step"]
            same = "" if eager is None else "  (eager's)" if all(
                abs(a - b) <= 2e-2 * abs(b) for a, b in zip(r["losses"], eager["losses"])) else "  DIFFER"
            print(f"{v:<10} {r['step'] * 1e3:9.1f} {tokens:11.0f} {r['first']:8.1f} {r['peak_gib']:9.2f}  "
                  f"{[round(x, 4) for x in r['losses']]}{same}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

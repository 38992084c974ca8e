"""GPT-2 (124M) first training step in a fresh process, cold and warm: kiln (with and without
its joint cache, KILN_JOINT_CACHE=0; with Dynamo's caching precompile) beside Inductor.

    PYTHONPATH=src python -m benchmarks.warm_train [--small] [--model nanogpt] [--runs 3] [--device cuda]
        [--variants kiln,kiln-no-joint,kiln-precompile,inductor,inductor-precompile] [--profile 25]

Each measurement is its own process. Per compiler, one process starts from empty caches (kiln,
Inductor, Triton: fresh temporary folders) and fills them (cold); later processes find them
(warm). A process times `import torch`, then from the compiler's import to the end of the
first step (forward, loss, backward; synchronized): Dynamo, AOTAutograd where it runs, the
compiler and one step. --model gpt2 (default) is transformers' GPT2LMHeadModel; under
TORCH_CACHING_PRECOMPILE=1 its loss is taken outside the compiled model, which Dynamo's
packaging requires. --model nanogpt is benchmarks/nanogpt.py's, its loss inside. --small: 2
layers, for a check on the CPU. --profile N: one more warm process per compiler under
cProfile, printing its N costliest functions (cumulative)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
imported = time.perf_counter() - t0
compiler, model_name, small, device = sys.argv[1], sys.argv[2], sys.argv[3] == "small", \
    torch.device(sys.argv[4])
torch.manual_seed(0)
batch, seq = (2, 64) if small else (8, 1024)
if model_name == "nanogpt":
    sys.path.insert(0, os.environ["WARM_REPO"])
    from benchmarks.nanogpt import GPT, GPTConfig, SMALL
    config = SMALL if small else GPTConfig()
    model = GPT(config).to(device).train()
    vocab = config.vocab_size
else:
    from transformers import GPT2Config, GPT2LMHeadModel
    size = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=128) if small else \
        dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50304, n_positions=1024)
    config = GPT2Config(**size, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    model = GPT2LMHeadModel(config).to(device).train()
    vocab = size["vocab_size"]
ids = torch.randint(0, vocab, (batch, seq), device=device)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
sync()
profile = int(os.environ.get("WARM_PROFILE", "0"))
if profile:
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
t1 = time.perf_counter()
if compiler == "inductor":
    compiled = torch.compile(model)
else:
    import kiln
    compiled = kiln.compile(model)
if model_name == "nanogpt":
    compiled(ids, ids).backward()
elif os.environ.get("TORCH_CACHING_PRECOMPILE") == "1":
    # Dynamo's precompile cannot package transformers' loss_function (a property): the loss is
    # taken outside the compiled model, as a nanoGPT-style loop does
    logits = compiled(ids).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
else:
    compiled(ids, labels=ids).loss.backward()
sync()
first = time.perf_counter() - t1
if profile:
    import pstats
    profiler.disable()
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(profile)
stats = {}
if compiler != "inductor":
    from kiln.runtime import training_cache
    stats = dict(training_cache.STATS)
elif os.environ.get("TORCH_CACHING_PRECOMPILE") == "1":
    torch.compiler.save_cache_artifacts()  # Dynamo's precompile cache is written when asked
print(json.dumps({"import_torch": imported, "first_step": first, "joint": stats}))
"""


def run(compiler: str, caches: dict[str, str], args: argparse.Namespace, extra: dict[str, str],
        profile: int = 0) -> dict:
    env = {**os.environ, **caches, "HF_HUB_OFFLINE": "1", **extra, "WARM_PROFILE": str(profile),
           "WARM_REPO": str(Path(__file__).resolve().parents[1])}
    size = "small" if args.small else "full"
    proc = subprocess.run([sys.executable, "-c", CHILD, compiler, args.model, size, args.device], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    if profile:
        print(proc.stderr[proc.stderr.find("   Ordered by"):], flush=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--model", choices=("gpt2", "nanogpt"), default="gpt2",
                        help="transformers' GPT-2, or benchmarks/nanogpt.py's (its loss inside)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--variants", default="kiln,kiln-no-joint,inductor")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args()
    precompile = {"TORCH_CACHING_PRECOMPILE": "1"}
    rows = {"kiln": ("kiln, joint cache", "kiln", {}),
            "kiln-no-joint": ("kiln, KILN_JOINT_CACHE=0", "kiln", {"KILN_JOINT_CACHE": "0"}),
            "kiln-precompile": ("kiln, TORCH_CACHING_PRECOMPILE=1", "kiln", precompile),
            "inductor": ("inductor", "inductor", {}),
            "inductor-precompile": ("inductor, TORCH_CACHING_PRECOMPILE=1", "inductor", precompile)}
    for label, compiler, extra in (rows[v] for v in args.variants.split(",")):
        with tempfile.TemporaryDirectory(prefix="warm-train-") as folder:
            names = (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                     ("TRITON_CACHE_DIR", "triton"))
            # Dynamo's precompile cache lives in Inductor's folder
            caches = {var: str(Path(folder) / name) for var, name in names}
            cold = run(compiler, caches, args, extra)
            warm = [run(compiler, caches, args, extra) for _ in range(args.runs)]
            if args.profile:  # inside the folder: the caches are removed with it
                print(f"{label}: a warm first step under cProfile", flush=True)
                run(compiler, caches, args, extra, args.profile)
        median = statistics.median(w["first_step"] for w in warm)
        print(f"{label}: cold first step {cold['first_step']:.2f} s; warm median {median:.2f} s "
              f"(runs {', '.join(format(w['first_step'], '.2f') for w in warm)}), import torch "
              f"{statistics.median(w['import_torch'] for w in warm):.2f} s"
              + (f", joint cache {warm[0]['joint']}" if compiler == "kiln" else ""), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()

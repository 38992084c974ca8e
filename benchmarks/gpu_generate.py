"""transformers' generate() with a compiled forward: eager vs Inductor vs kiln in one process.

    PYTHONPATH=src python -m benchmarks.gpu_generate [--batch 4] [--prompt 128] [--new-tokens 64]
    PYTHONPATH=src python -m benchmarks.gpu_generate --cache static
    PYTHONPATH=src python -m benchmarks.gpu_generate --small --device cpu --variants eager,kiln

A Llama-style model with random weights (8 layers, hidden 1024 by default; bf16 on cuda, float32
on cpu), `model.forward` compiled, greedy decoding of exactly --new-tokens tokens. Per variant:
the first generate() (compiles included), ms per token of later runs (median of --repeat runs,
(t(N tokens) - t(1 token)) / (N - 1), so the prefill is left out), compiles after the first prompt
length and after a second one (--prompt2), and how many generated tokens equal eager's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

CACHES = (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"))
for var, prefix in CACHES:
    os.environ[var] = tempfile.mkdtemp(prefix=f"gpu-generate-{prefix}-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

FULL = {"layers": 8, "hidden": 1024, "intermediate": 2816, "heads": 16, "vocab": 32000,
        "batch": 4, "prompt": 128, "prompt2": 96, "new_tokens": 64}
SMALL = {"layers": 2, "hidden": 64, "intermediate": 176, "heads": 4, "vocab": 512,
         "batch": 2, "prompt": 16, "prompt2": 12, "new_tokens": 8}


def make_model(args, device: torch.device, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=2048)
    return LlamaForCausalLM(config).to(device, dtype).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compiles() -> dict:
    """Dynamo graphs (either backend) and kiln's ATen graphs compiled and run in ATen, so far."""
    import kiln

    stats = kiln.stats()
    return {"dynamo": torch._dynamo.utils.counters["stats"]["unique_graphs"],
            "kiln": stats.graphs_compiled, "aten": sum(stats.graphs_in_aten.values())}


def since(before: dict) -> dict:
    return {k: v - before[k] for k, v in compiles().items()}


def run_variant(variant: str, model, prompts: list, args, device: torch.device) -> dict:
    torch._dynamo.reset()
    if variant == "inductor":
        model.forward = torch.compile(model.forward)
    elif variant == "kiln":
        import kiln

        model.forward = kiln.compile(model.forward, dynamic=True if args.dynamic else None)
    elif variant != "eager":
        raise SystemExit(f"unknown variant {variant!r}: eager, inductor or kiln")
    calls: list[tuple[float, str]] = []
    if args.slow_calls:
        model.forward = timed_calls(model.forward, calls, device)
    extra = {"cache_implementation": "static"} if args.cache == "static" else {}

    def generate(ids: torch.Tensor, n: int) -> tuple[torch.Tensor, float]:
        _sync(device)
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=0, disable_compile=True, **extra)
        _sync(device)
        return out[:, ids.shape[1]:], time.perf_counter() - t0

    n = args.new_tokens
    before = compiles()
    tokens1, first = generate(prompts[0], n)
    generate(prompts[0], 1)  # a prefill-only run, untimed: anything it compiles counts before timing
    many, one = [], []
    for _ in range(args.repeat):
        many.append(generate(prompts[0], n)[1])
        one.append(generate(prompts[0], 1)[1])
    after_first = since(before)
    if args.slow_calls:
        print_slow_calls(variant, calls)
    tokens2, first2 = generate(prompts[1], n)
    after_both = since(before)
    if variant != "eager":
        del model.forward  # the class's forward again
    t_many, t_one = statistics.median(many), statistics.median(one)
    return {"tokens": (tokens1, tokens2), "first_s": first, "first2_s": first2, "prefill_ms": 1e3 * t_one,
            "ms_per_token": 1e3 * (t_many - t_one) / max(n - 1, 1), "gen_ms": 1e3 * t_many,
            "after_first": after_first, "after_both": after_both}


def timed_calls(forward, calls: list, device: torch.device):
    """forward, each call awaited and timed with its inputs' shapes (what the first generate's
    time was spent on: a compile, a kernel's first launch, a library's plan for a new shape)."""

    def timed(*args, **kwargs):
        _sync(device)
        t0 = time.perf_counter()
        out = forward(*args, **kwargs)
        _sync(device)
        shapes = [tuple(v.shape) for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        calls.append((time.perf_counter() - t0, str(shapes)))
        return out

    return timed


def print_slow_calls(variant: str, calls: list, top: int = 12) -> None:
    ranked = sorted(range(len(calls)), key=lambda i: -calls[i][0])
    print(f"{variant}: {len(calls)} forward calls in {sum(t for t, _ in calls):.2f} s; slowest:")
    for i in ranked[:top]:
        print(f"  call {i}: {calls[i][0]:.3f} s, inputs {calls[i][1]}")


def compile_breakdown() -> str:
    """Where kiln's compiles spent their time: its passes, and building kernels among them."""
    from kiln.frontend.backend import REPORTS

    passes = sum(r.seconds for r in REPORTS)
    build = sum(p.seconds for r in REPORTS for p in r.passes if p.name == "build")
    text = f"kiln's passes {passes:.2f} s over {len(REPORTS)} graphs, {build:.2f} s of them building kernels"
    try:  # Dynamo's and AOTAutograd's own timers, summed over every compile
        headers, values = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
        timed = sorted(zip(headers, values), key=lambda hv: -float(hv[1] or 0))[:6]
        text += "\nDynamo's timers (s): " + ", ".join(f"{h} {float(v):.2f}" for h, v in timed)
    except Exception as e:  # noqa: BLE001 - a timer's shape differs between torch versions
        text += f"\nDynamo's timers unavailable: {e}"
    return text


def agreement(tokens: tuple, eager: tuple, exact: bool) -> str:
    equal = sum(int((a == b).sum()) for a, b in zip(tokens, eager))
    total = sum(a.numel() for a in eager)
    if exact:
        return "yes" if equal == total else f"no ({equal / total:.3f} equal)"
    return f"{equal / total:.3f}"


def compile_text(c: dict, variant: str) -> str:
    if variant == "eager":
        return "-"
    text = f"{c['dynamo']}"
    if variant == "kiln":
        text += f" / {c['kiln']}" + (f" ({c['aten']} in ATen)" if c["aten"] else "")
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="bfloat16 on cuda, float32 on cpu unless given")
    parser.add_argument("--small", action="store_true", help="a tiny model and few tokens, for the CPU")
    for name in FULL:
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                            help=f"default {FULL[name]} ({SMALL[name]} with --small)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per variant")
    parser.add_argument("--cache", default="dynamic", choices=["dynamic", "static"])
    parser.add_argument("--variants", default="eager,inductor,kiln")
    parser.add_argument("--dynamic", action="store_true",
                        help="kiln.compile(..., dynamic=True): symbolic sizes from the first call")
    parser.add_argument("--slow-calls", action="store_true",
                        help="time each forward call up to the first timed run, print the slowest")
    args = parser.parse_args()
    for name, value in (SMALL if args.small else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))

    model = make_model(args, device, dtype)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, args.vocab, (args.batch, p), generator=g).to(device)
               for p in (args.prompt, args.prompt2)]
    results = {}
    for variant in args.variants.split(","):
        results[variant] = r = run_variant(variant, model, prompts, args, device)
        counts = [compile_text(r[k], variant) for k in ("after_first", "after_both")]
        print(f"{variant}: first generate {r['first_s']:.2f} s, {r['ms_per_token']:.2f} ms/token, "
              f"compiles {counts[0]} then {counts[1]}", flush=True)
        if variant == "kiln":
            import kiln

            print(kiln.stats(), flush=True)  # why a graph compiled per shape or ran in ATen
            print(compile_breakdown(), flush=True)

    eager = results.get("eager")
    exact = dtype == torch.float32
    print(f"\nLlama {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, "
          f"{str(dtype).removeprefix('torch.')} on {device}; batch {args.batch}, prompt {args.prompt} "
          f"then {args.prompt2}, {args.new_tokens} new tokens (greedy), {args.cache} cache")
    print("ms/token = (median t(generate N tokens) - median t(generate 1 token)) / (N - 1): decode steps "
          "only; prefill = median t(generate 1 token). compiles: Dynamo graphs (/ kiln ATen graphs); "
          f"same tokens: {'equal to eager exactly' if exact else 'fraction equal to eager'}, both prompts")
    print("\n| variant | first generate s | ms/token | vs eager | prefill ms | prompt 2 first s "
          "| compiles prompt 1 | compiles both | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for variant, r in results.items():
        speed = f"{eager['ms_per_token'] / r['ms_per_token']:.2f}x" if eager else "-"
        same = agreement(r["tokens"], eager["tokens"], exact) if eager else "-"
        print(f"| {variant} | {r['first_s']:.2f} | {r['ms_per_token']:.2f} | {speed} | {r['prefill_ms']:.1f} "
              f"| {r['first2_s']:.2f} | {compile_text(r['after_first'], variant)} "
              f"| {compile_text(r['after_both'], variant)} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

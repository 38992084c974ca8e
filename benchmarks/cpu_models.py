"""transformers models on the CPU: eager vs Inductor vs kiln, inference, float32, in one process.

    PYTHONPATH=src python -m benchmarks.cpu_models                     # every model below
    PYTHONPATH=src python -m benchmarks.cpu_models --models bert,llama --calls 20

Each model is its family's base model built from a small config with random weights (2 layers,
hidden 256, 4 heads, batch 2 x 128 tokens; no download). Per model and variant: the first
call (compile included), the median time of a call after warm-up, and the largest difference
of the last hidden state from eager's. Timed calls alternate between the variants, so a busy
moment of the machine costs each of them alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

for var, prefix in (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
    os.environ.setdefault(var, tempfile.mkdtemp(prefix=f"cpu-models-{prefix}-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

SIZE = {"hidden": 256, "layers": 2, "heads": 4, "ffn": 1024, "vocab": 1024, "positions": 512}

# name -> (config class, its field names for: hidden, layers, heads, ffn, vocab, positions)
STANDARD = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
            "max_position_embeddings")
MODELS = {
    "bert": ("BertConfig", STANDARD),
    "roberta": ("RobertaConfig", STANDARD),
    "electra": ("ElectraConfig", STANDARD),
    "albert": ("AlbertConfig", STANDARD),
    "distilbert": ("DistilBertConfig", ("dim", "n_layers", "n_heads", "hidden_dim", "vocab_size",
                                        "max_position_embeddings")),
    "deberta-v2": ("DebertaV2Config", STANDARD),
    "gpt2": ("GPT2Config", ("n_embd", "n_layer", "n_head", "n_inner", "vocab_size", "n_positions")),
    "gpt-neo": ("GPTNeoConfig", ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size",
                                 "max_position_embeddings")),
    "opt": ("OPTConfig", ("hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim", "vocab_size",
                          "max_position_embeddings")),
    "llama": ("LlamaConfig", STANDARD),
    "mistral": ("MistralConfig", STANDARD),
    "qwen2": ("Qwen2Config", STANDARD),
    "gemma": ("GemmaConfig", STANDARD),
    "phi": ("PhiConfig", STANDARD),
    "stablelm": ("StableLmConfig", STANDARD),
    "gpt-neox": ("GPTNeoXConfig", STANDARD),
    "mpnet": ("MPNetConfig", STANDARD),
}

EXTRA = {  # what a config needs beyond the sizes to be valid at them
    "gpt2": {"bos_token_id": 0, "eos_token_id": 0},
    "gpt-neo": {"attention_types": [[["global", "local"], SIZE["layers"] // 2]], "bos_token_id": 0,
                "eos_token_id": 0},
}


def make_model(name: str) -> torch.nn.Module:
    import transformers

    config_class, fields = MODELS[name]
    values = [SIZE["hidden"], SIZE["layers"], SIZE["heads"], SIZE["ffn"], SIZE["vocab"], SIZE["positions"]]
    config = getattr(transformers, config_class)(**dict(zip(fields, values)), **EXTRA.get(name, {}))
    if hasattr(config, "num_key_value_heads"):
        config.num_key_value_heads = SIZE["heads"]
    if hasattr(config, "head_dim") and name == "gemma":
        config.head_dim = SIZE["hidden"] // SIZE["heads"]
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(config).eval()


def last_hidden(out) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def run(name: str, variants: list[str], calls: int, batch: int, tokens: int) -> list[dict]:
    model = make_model(name)
    ids = torch.randint(1, SIZE["vocab"], (batch, tokens), generator=torch.Generator().manual_seed(1))
    fns, rows = {}, {}
    for variant in variants:
        torch._dynamo.reset()
        if variant == "kiln":
            import kiln

            fn = kiln.compile(model)
        elif variant == "inductor":
            fn = torch.compile(model)
        else:
            fn = model

        def call(fn=fn):
            with torch.no_grad():
                return last_hidden(fn(input_ids=ids))

        t0 = time.perf_counter()
        out = call()
        rows[variant] = {"model": name, "variant": variant, "first_s": time.perf_counter() - t0, "out": out}
        fns[variant] = call
        for _ in range(3):
            call()
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(calls):  # in turns
        for variant, call in fns.items():
            t0 = time.perf_counter()
            call()
            times[variant].append(time.perf_counter() - t0)
    reference = rows[variants[0]]["out"]
    for variant, row in rows.items():
        row["ms"] = 1e3 * statistics.median(times[variant])
        row["max_diff"] = (row.pop("out") - reference).abs().max().item()
    return list(rows.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--variants", default="eager,inductor,kiln")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args()
    variants = args.variants.split(",")
    print(f"CPU ({os.cpu_count()} cores), torch {torch.__version__}, float32 inference, batch {args.batch} x "
          f"{args.tokens} tokens; {SIZE}")
    head = "| model | " + " | ".join(f"{v} ms" for v in variants)
    head += " | kiln vs eager | kiln vs Inductor | first call s | max diff |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name in args.models.split(","):
        try:
            rows = {r["variant"]: r for r in run(name, variants, args.calls, args.batch, args.tokens)}
        except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end of the run
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:120]} |", flush=True)
            continue
        ms = " | ".join(f"{rows[v]['ms']:.2f}" for v in variants)

        def ratio(base: str) -> str:
            return f"{rows[base]['ms'] / rows['kiln']['ms']:.2f}x" if base in rows and "kiln" in rows else "-"

        first = " / ".join(f"{rows[v]['first_s']:.1f}" for v in variants)
        diff = max(r["max_diff"] for r in rows.values())
        ratios = f"{ratio('eager')} | {ratio('inductor')}"
        print(f"| {name} | {ms} | {ratios} | {first} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()

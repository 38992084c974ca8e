"""A matmul and its element-wise epilogue on the CPU: eager, Inductor and kiln side by side.

    PYTHONPATH=src python -m benchmarks.cpu_matmul_epilogue [--repeat 200]
    PYTHONPATH=src python -m benchmarks.cpu_matmul_epilogue --decode


Per shape (m rows x k x n) and layout ("dot": gelu(linear(x, w, b)), a Linear's weight as
stored; "rows": relu(x @ w + b), w contiguous along n), float32: the median time of one call
(Dynamo's guards included) of eager, Inductor, kiln with ATen's matmul (matmul_templates=False),
kiln with the C++ template (True) and kiln's own choice (the default), calls taken in turns;
and what kiln's cost model chose. Every compiled result is checked against eager's first.
--decode: greedy generate() of a small Llama (2 layers, hidden 256, batch 1, 32 prompt tokens)
with eager's forward, kiln's (default: templates where the model says) and kiln's with ATen's
matmuls, in turns: ms per decoded token, (t(33 tokens) - t(1 token)) / 32.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

import kiln
from benchmarks.measure import check_close, time_interleaved

SHAPES = [(1, 256, 256), (4, 256, 256), (8, 256, 1024), (16, 256, 256), (64, 256, 256), (256, 256, 1024)]


def _dot(x, w, b):
    return F.gelu(F.linear(x, w, b))


def _rows(x, w, b):
    return torch.relu(x @ w + b)


def _choice(fn, args) -> str:
    explanation = kiln.explain(fn, *args)
    verdicts = [d.verdict for g in explanation.graphs for d in g.decisions if "mm" in d.node]
    return verdicts[0] if verdicts else "-"


def decode(rounds: int = 8) -> None:
    import copy
    import time

    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=704,
                                      num_hidden_layers=2, num_attention_heads=4)
    base = transformers.LlamaForCausalLM(config).eval()
    models = {}
    for name, option in (("eager", "eager"), ("kiln", None), ("kiln, ATen matmuls", False)):
        models[name] = model = copy.deepcopy(base)
        if option != "eager":
            model.forward = kiln.compile(model.forward, matmul_templates=option)
    ids = torch.randint(0, 2048, (1, 32), generator=torch.Generator().manual_seed(0))
    per_token: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        expected = base.generate(ids, max_new_tokens=33, do_sample=False)
        for name, model in models.items():
            if not torch.equal(model.generate(ids, max_new_tokens=33, do_sample=False), expected):
                raise SystemExit(f"{name}: tokens differ from eager's")
        for _ in range(rounds):
            for name, model in models.items():
                t0 = time.perf_counter()
                model.generate(ids, max_new_tokens=33, do_sample=False)
                t1 = time.perf_counter()
                model.generate(ids, max_new_tokens=1, do_sample=False)
                t2 = time.perf_counter()
                per_token[name].append(((t1 - t0) - (t2 - t1)) / 32)
    print("| variant | ms per token (median) | vs eager |")
    print("|---|---|---|")
    eager = statistics.median(per_token["eager"])
    for name, samples in per_token.items():
        ms = statistics.median(samples)
        print(f"| {name} | {ms * 1e3:.3f} | {eager / ms:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--decode", action="store_true", help="a small Llama's generate() instead")
    args = parser.parse_args()
    if args.decode:
        decode()
        return
    g = torch.Generator().manual_seed(0)
    print("| layout | m x k x n | eager us | Inductor us | kiln, ATen matmul us | kiln, template us "
          "| kiln default us | chosen | template / ATen matmul | default / Inductor |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for layout, fn in (("dot", _dot), ("rows", _rows)):
        for m, k, n in SHAPES:
            x, b = torch.randn(m, k, generator=g), torch.randn(n, generator=g)
            w = torch.randn(n, k, generator=g) / k ** 0.5
            inputs = (x, w if layout == "dot" else w.t().contiguous(), b)
            torch._dynamo.reset()
            variants = {"eager": fn, "inductor": torch.compile(fn)}
            for name, option in (("aten", False), ("template", True), ("default", None)):
                variants[name] = kiln.compile(fn, matmul_templates=option)
            with torch.no_grad():
                expected = fn(*inputs)
                for name, variant in variants.items():
                    problem = check_close(variant(*inputs), expected)
                    if problem:
                        raise SystemExit(f"{layout} {m}x{k}x{n} {name}: {problem}")
                samples = time_interleaved(variants, inputs, args.repeat)
                chosen = _choice(fn, inputs)
            us = {name: statistics.median(s) * 1e6 for name, s in samples.items()}
            names = ("eager", "inductor", "aten", "template", "default")
            times = " | ".join(f"{us[name]:.1f}" for name in names)
            print(f"| {layout} | {m} x {k} x {n} | {times} | {chosen} | {us['template'] / us['aten']:.2f} "
                  f"| {us['default'] / us['inductor']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

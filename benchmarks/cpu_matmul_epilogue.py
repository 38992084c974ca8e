"""A matmul and its element-wise epilogue on the CPU: eager, Inductor and kiln side by side.

    PYTHONPATH=src python -m benchmarks.cpu_matmul_epilogue [--repeat 200]

Per shape (m rows x k x n) and layout ("dot": gelu(linear(x, w, b)), a Linear's weight as
stored; "rows": relu(x @ w + b), w contiguous along n), float32: the median time of one call
(Dynamo's guards included) of eager, Inductor, kiln with ATen's matmul (matmul_templates=False),
kiln with the C++ template (True) and kiln's own choice (the default), calls taken in turns;
and what kiln's cost model chose. Every compiled result is checked against eager's first.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
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
            print(f"| {layout} | {m} x {k} x {n} | {us['eager']:.1f} | {us['inductor']:.1f} | {us['aten']:.1f} "
                  f"| {us['template']:.1f} | {us['default']:.1f} | {chosen} | {us['template'] / us['aten']:.2f} "
                  f"| {us['default'] / us['inductor']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

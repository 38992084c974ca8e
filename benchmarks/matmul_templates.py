"""kiln's matmul templates (passes/matmul.py) on an NVIDIA GPU, in one process: each case in
eager, Inductor's default, kiln with every matmul in cuBLAS, kiln's default (the cost model's
choice per matmul), and kiln's template forced with each launch configuration of the
template (codegen/templates/matmul.py's CANDIDATES) in turn.

    PYTHONPATH=src python -m benchmarks.matmul_templates [--cases gelu,residual,ffn] [--per-call]

Times as benchmarks/gpu.py's: medians of CUDA-graph replays of back-to-back calls on rotating
inputs, or with --per-call one call at a time with the L2 flushed before each.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["KILN_GRAPH_CACHE"] = "0"  # each configuration compiles afresh

import torch  # noqa: E402

from benchmarks import gpu  # noqa: E402 - sets the temporary caches first

BF16 = torch.bfloat16


def residual(x, w, r):
    return x @ w + r


def cases():
    """(name, fn, args, flops, tolerance)."""
    x, w, b = (
        gpu.r(8192, 768, dtype=BF16),
        gpu.r(768, 3072, dtype=BF16) * 0.036,
        gpu.r(3072, dtype=BF16) * 0.02,
    )
    yield (
        "gelu: gelu(x @ w + b) 8192x768 @ 768x3072 bf16",
        gpu.bias_gelu,
        (x, w, b),
        2 * 8192 * 768 * 3072,
        2e-2,
    )
    x, w, r = (
        gpu.r(8192, 3072, dtype=BF16),
        gpu.r(3072, 768, dtype=BF16) * 0.018,
        gpu.r(8192, 768, dtype=BF16),
    )
    yield "residual: x @ w + r 8192x3072 @ 3072x768 bf16", residual, (x, w, r), 2 * 8192 * 3072 * 768, 2e-2
    x = gpu.r(8192, 4096, dtype=BF16)
    wn, wg, wu, wd = (
        gpu.r(4096, dtype=BF16),
        gpu.r(4096, 11008, dtype=BF16) * 0.02,
        gpu.r(4096, 11008, dtype=BF16) * 0.02,
        gpu.r(11008, 4096, dtype=BF16) * 0.02,
    )
    yield (
        "ffn: rmsnorm+swiglu 8192x4096 h11008 bf16",
        gpu.ffn,
        (x, wn, wg, wu, wd),
        2 * 8192 * 4096 * 11008 * 3,
        5e-2,
    )


def _kiln(fn, **options):
    import kiln

    torch._dynamo.reset()
    return kiln.compile(fn, **options)


def _forced(fn, config):
    """kiln with every qualifying matmul a template of this launch configuration."""
    from kiln.codegen.templates import matmul

    original = matmul.launch_config
    matmul.launch_config = lambda kernel, interpreted: original(kernel, True) if interpreted else config
    try:
        compiled = _kiln(fn, matmul_templates=True)
        gpu.first_call(compiled, ARGS)  # builds its kernels while the configuration is set
    finally:
        matmul.launch_config = original
    return compiled


ARGS: tuple = ()


def main() -> int:
    global ARGS
    from kiln.codegen.templates import matmul
    from kiln.frontend.backend import REPORTS

    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="")
    parser.add_argument("--per-call", action="store_true")
    args = parser.parse_args()
    gpu.PER_CALL = args.per_call
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    peak = gpu.matmul_rate()
    print(
        f"{torch.cuda.get_device_name()}: bf16 matmul {peak / 1e12:.0f} TFLOP/s (cuBLAS, 8192^3); "
        + ("one call at a time, L2 flushed" if args.per_call else "CUDA-graph replays"),
        flush=True,
    )
    for name, fn, fargs, flops, tol in cases():
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        ARGS = fargs
        with torch.no_grad():
            ref = fn(*fargs)
        print(f"\n{name}")
        variants = [
            ("eager", lambda: fn),
            ("inductor default", lambda: (torch._dynamo.reset(), torch.compile(fn))[1]),
            ("kiln, cuBLAS", lambda: _kiln(fn, matmul_templates=False)),
            ("kiln default (cost model)", lambda: _kiln(fn)),
        ]
        variants += [(f"kiln template {c}", lambda c=c: _forced(fn, c)) for c in matmul.CANDIDATES]
        inductor = None
        for label, make in variants:
            before = len(REPORTS)
            try:
                compiled = make()
                _, out = gpu.first_call(compiled, fargs)
            except Exception as e:  # noqa: BLE001 - one configuration's failure is a row
                print(f"  {label:<42} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            problem = gpu.check(out, ref, tol)
            seconds = gpu.bench(compiled, fargs)
            inductor = seconds if label.startswith("inductor") else inductor
            verdicts = [
                d.verdict
                for rep in REPORTS[before:]
                for d in rep.decisions
                if d.verdict in ("template", "cuBLAS")
            ]
            ratio = f"{inductor / seconds:.2f}x Inductor" if inductor else ""
            print(
                f"  {label:<42} {seconds * 1e6:9.1f} us {flops / seconds / 1e12:6.0f} TFLOP/s  {ratio:<16}"
                f"{' '.join(verdicts)}{'  FAIL ' + problem if problem else ''}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

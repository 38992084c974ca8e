"""Many sequence lengths through one compiled function: `gelu(x @ w) * sigmoid(x)` with x of
shape [8, L, hidden], L = 128 + 37 i for 20 lengths, called once per length (then once more per
length, timed). For kiln as one program per shape family, kiln per shape (KILN_SYMBOLIC=0),
Inductor and eager, in one process: compiles, total seconds of the first pass (compiles
included) and milliseconds per call of the second pass.

    PYTHONPATH=src python -m benchmarks.dynamic_shapes                 # CPU: hidden 256
    PYTHONPATH=src python -m benchmarks.dynamic_shapes --device cuda   # hidden 1024
    ... --device cuda --mode reduce-overhead   # CUDA graphs (kiln: by bucket), both compilers
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


def case(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w) * torch.sigmoid(x)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(name: str, fn, inputs: list, w: torch.Tensor, device: torch.device, compiles) -> dict:
    torch._dynamo.reset()
    before = compiles()
    _sync(device)
    t0 = time.perf_counter()
    for x in inputs:  # first pass: compiles included
        fn(x, w)
    _sync(device)
    total = time.perf_counter() - t0
    per_call = []
    for x in inputs:  # second pass: every program exists
        _sync(device)
        t1 = time.perf_counter()
        fn(x, w)
        _sync(device)
        per_call.append(time.perf_counter() - t1)
    return {"variant": name, "compiles": compiles() - before, "total_s": total,
            "ms_per_call": 1e3 * statistics.median(per_call)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--lengths", type=int, default=20)
    parser.add_argument("--variants", default="kiln,kiln_per_shape,inductor,eager")
    parser.add_argument("--mode", default=None, choices=["reduce-overhead"])
    args = parser.parse_args()
    device = torch.device(args.device)
    hidden = args.hidden or (1024 if device.type == "cuda" else 256)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-bench-"))
    os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-bench-"))
    import kiln
    from kiln.frontend.backend import REPORTS

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(hidden, hidden, generator=g) / hidden**0.5).to(device, dtype)
    lengths = [128 + 37 * i for i in range(args.lengths)]
    inputs = [torch.randn(8, n, hidden, generator=g).to(device, dtype) for n in lengths]
    for x in inputs[:2]:  # the results agree with eager before anything is timed
        torch.testing.assert_close(torch.compile(case, backend="kiln")(x, w), case(x, w),
                                   rtol=2e-2, atol=2e-2)
    torch._dynamo.reset()

    def kiln_compiles() -> int:
        return kiln.stats().graphs_compiled

    dynamo_frames = torch._dynamo.utils.counters["stats"]

    def inductor_compiles() -> int:
        return dynamo_frames["unique_graphs"]

    def kiln_fn():
        return kiln.compile(case, mode=args.mode) if args.mode else torch.compile(case, backend="kiln")

    rows = []
    for variant in args.variants.split(","):
        if variant == "kiln":
            os.environ["KILN_SYMBOLIC"] = "1"
            rows.append(run_variant("kiln (family)", kiln_fn(), inputs, w, device, kiln_compiles))
            graphs = [r.graphs for r in REPORTS if getattr(r, "graphs", None) is not None]
            if graphs:
                print(graphs[-1].text())
        elif variant == "kiln_per_shape":
            os.environ["KILN_SYMBOLIC"] = "0"
            rows.append(run_variant("kiln per shape", kiln_fn(), inputs, w, device, kiln_compiles))
            os.environ["KILN_SYMBOLIC"] = "1"
        elif variant == "inductor":
            rows.append(run_variant("inductor", torch.compile(case, mode=args.mode), inputs, w, device,
                                    inductor_compiles))
        elif variant == "eager":
            rows.append(run_variant("eager", case, inputs, w, device, lambda: 0))
    print(f"gelu(x @ w) * sigmoid(x), x [8, L, {hidden}] {str(dtype).removeprefix('torch.')}, "
          f"{args.lengths} lengths L = 128 + 37 i, on {device}, mode {args.mode or 'default'}")
    print(f"{'variant':<16} {'compiles':>8} {'total s':>9} {'ms/call':>9}")
    for r in rows:
        print(f"{r['variant']:<16} {r['compiles']:>8} {r['total_s']:>9.2f} {r['ms_per_call']:>9.3f}")


if __name__ == "__main__":
    main()

"""A user's @triton.jit kernel between element-wise ops, on an NVIDIA GPU: eager, kiln and
Inductor in one process.

    PYTHONPATH=src:tests python -m benchmarks.gpu_user_triton

Case: sin(x) -> the user's add kernel -> cos(.) * 2. Eager runs four kernels; kiln and Inductor
three (the user's kernel splits fusion). Large: device time of CUDA-graph replays (benchmarks.gpu
bench) and one call at a time with the L2 flushed; small: a loop of calls timed on the host
(what the host program's launch of the user's kernel costs).
"""

from __future__ import annotations

import sys

import torch

from benchmarks import gpu


def main() -> int:
    from triton_user_kernels import add_between_kernels, add_kernel

    import kiln

    fn = add_between_kernels(add_kernel)
    compiled = {
        "eager": fn,
        "kiln": kiln.compile(fn, fullgraph=True),
        "inductor": torch.compile(fn, fullgraph=True),
    }
    rows = []
    for n in (64 << 20, 4096):
        args = (gpu.r(n), gpu.r(n))
        expected = fn(*args)
        for name, f in compiled.items():
            problem = gpu.check(f(*args), expected, 1e-4)
            if problem:
                print(f"{name} n={n}: FAIL {problem}")
                return 1
        if n > 1 << 20:
            for name, f in compiled.items():
                moved = (9 if name == "eager" else 7) * n * 4  # bytes read + written per call
                replay, per_call = gpu.bench(f, args), gpu.bench_per_call(f, args)
                rows.append(
                    f"| {name} | {n} | {replay * 1e3:.3f} ms ({moved / replay / 1e12:.2f} TB/s) | "
                    f"{per_call * 1e3:.3f} ms |"
                )
        else:
            host = gpu.bench_host(list(compiled.values()), args)
            rows += [f"| {name} | {n} | host loop {t * 1e6:.1f} us | |" for name, t in zip(compiled, host)]
    print("| | elements | CUDA-graph replay (or host loop) | one call, L2 flushed |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The instruction floor of the H200's memory-bound cases, computed without a GPU.

A kernel is bound by memory only while its instructions issue faster than its bytes move.
This script generates the Triton kernels of the cases in benchmarks/gpu.py (without running
them), compiles each for sm_90 with its heuristic launch configuration, counts the machine
instructions (SASS, through the cuobjdump in Triton's wheel) and divides by the elements a
thread handles. An SM issues one warp instruction per scheduler per cycle, so

    issue floor = instructions per element x elements / (32 lanes x 4 schedulers x 132 SMs x 1.98 GHz)

against the memory floor, bytes moved / copy rate. The count is static, through the kernel's
last EXIT (the slow paths after it run only for rare operands): it is what runs, give or take
a few branches, for kernels without loops (element-wise and one-tile row kernels, which these are).

    python -m benchmarks.issue_floor [--cases layernorm,softmax]
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

COPY_RATE = 4.22e12  # bytes read + written per second, measured on the H200 (docs/benchmarks.md)
ISSUE_RATE = 32 * 4 * 132 * 1.98e9  # thread instructions per second: lanes x schedulers x SMs x clock

COUNT = textwrap.dedent('''
    import collections, os, pickle, re, subprocess, sys
    import triton
    from kiln.codegen import triton as tr
    from kiln.codegen import triton_launch
    from kiln.runtime.triton_build import _resources, compile_for_target, programs_per_sm

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    out = {}
    for name, kernels in pickle.load(open(sys.argv[1], "rb")).items():
        rows = []
        for kern in kernels:
            config = triton_launch.launch_config(kern, False)
            compiled = compile_for_target(kern, tr.render_source(kern))
            cubin = os.path.join(sys.argv[2], kern.name + ".cubin")
            open(cubin, "wb").write(compiled.asm["cubin"])
            sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
            code = [line for line in sass.splitlines() if re.match(r"\\s+/\\*[0-9a-f]{4}\\*/", line)]
            # what runs: through the last EXIT; the slow paths of IEEE division and square
            # root follow it as subroutines that ordinary operands never call
            count = max(i + 1 for i, line in enumerate(code) if re.search(r"\\bEXIT\\b", line))
            xblock, rblock, warps = config
            per_thread = xblock * rblock / (32 * warps)
            numel = kern.outer_numel * max(kern.reduce_numel, 1)
            registers = _resources(compiled)[0]
            rows.append((kern.name, config, count, per_thread, numel, registers, programs_per_sm(registers, warps)))
        out[name] = rows
    pickle.dump(out, open(sys.argv[3], "wb"))
''')


def cases():
    """(name, fn, args, bytes moved) of benchmarks/gpu.py's memory-bound cases, on the CPU."""
    import torch

    from benchmarks import gpu

    bf16 = torch.bfloat16
    x, w, b = torch.randn(16384, 4096, dtype=bf16), torch.randn(4096, dtype=bf16), torch.randn(4096, dtype=bf16)
    yield "layernorm+gelu 16384x4096 bf16", gpu.layernorm_gelu, (x, w, b), 2 * x.nbytes + w.nbytes + b.nbytes
    yield "rmsnorm 16384x4096 bf16", gpu.rmsnorm, (x, w), 2 * x.nbytes + w.nbytes
    s = torch.randn(65536, 1024, dtype=bf16)
    yield "softmax 65536x1024 bf16", gpu.softmax, (s,), 2 * s.nbytes
    c = torch.randn(1 << 26)
    yield "chain 64M f32", gpu.chain, (c, c), 3 * c.nbytes
    x, w = torch.randn(16381, 4093, dtype=bf16), torch.randn(4093, dtype=bf16)
    yield "rmsnorm 16381x4093 bf16 (odd)", gpu.rmsnorm, (x, w), 2 * x.nbytes + w.nbytes
    s = torch.randn(65521, 1021, dtype=bf16)
    yield "softmax 65521x1021 bf16 (odd)", gpu.softmax, (s,), 2 * s.nbytes
    x, w = torch.randn(5000, 3000, dtype=bf16), torch.randn(3000, dtype=bf16)
    yield "rmsnorm 5000x3000 bf16 (odd, 60 MB)", gpu.rmsnorm, (x, w), 2 * x.nbytes + w.nbytes
    s = torch.randn(50000, 1000, dtype=bf16)
    yield "softmax 50000x1000 bf16 (odd, 200 MB)", gpu.softmax, (s,), 2 * s.nbytes


def generate(wanted: list[str]) -> dict:
    """Each case's kernels, generated through the Triton path; the kernels are not run."""
    import torch

    import kiln
    from kiln.frontend.backend import REPORTS
    from kiln.runtime import triton_build

    def skip(kernel, jit_fn):
        def launch(*tensors):
            pass

        launch.aligned = launch
        return launch

    triton_build._interpreted_launcher = skip
    out = {}
    for name, fn, args, moved in cases():
        if wanted and not any(w in name for w in wanted):
            continue
        torch._dynamo.reset()
        before = len(REPORTS)
        with torch.no_grad():
            kiln.compile(fn)(*args)
        out[name] = ([k for r in REPORTS[before:] for k in r.kernels], moved)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="")
    args = parser.parse_args()
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(KILN_TARGET="triton", TRITON_INTERPRET="1", KILN_CACHE_DIR=tmp)
        generated = generate(wanted)
        kernels_path, counts_path = os.path.join(tmp, "kernels.pkl"), os.path.join(tmp, "counts.pkl")
        Path(kernels_path).write_bytes(pickle.dumps({name: kernels for name, (kernels, _) in generated.items()}))
        env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KILN_TARGET")}
        subprocess.run([sys.executable, "-c", COUNT, kernels_path, tmp, counts_path], env=env, check=True)
        counts = pickle.loads(Path(counts_path).read_bytes())
    print("| case | kernel | launch config | registers (programs an SM holds) | SASS instructions | per element "
          "| issue floor us | memory floor us |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows in counts.items():
        moved = generated[name][1]
        for kernel, config, count, per_thread, numel, registers, programs in rows:
            per_element = count / per_thread
            print(f"| {name} | {kernel} | {config} | {registers} ({programs}) | {count} | {per_element:.1f} | "
                  f"{per_element * numel / ISSUE_RATE * 1e6:.1f} | {moved / COPY_RATE * 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

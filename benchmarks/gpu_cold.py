"""Cold compile in a fresh process: each case's first call under kiln and under Inductor, each
in a new Python process with empty kiln, Inductor and Triton caches.

    PYTHONPATH=src python -m benchmarks.gpu_cold [--cases chain,rmsnorm] [--out FILE.md]

A process imports torch, makes the case's inputs, then times from the compiler's import to
the end of the first call (Dynamo's tracing, the compiler's own start-up, compiling and one
run), minus one warm call. benchmarks.gpu measures cold compiles inside one process, after
its one-time start-up; this is what a user's new process pays.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def one(case: str, compiler: str) -> dict:
    """Runs in the fresh process."""
    import torch

    from benchmarks import gpu

    name, fn, args, *_ = next(c for c in gpu.cases() if c[0] == case)
    torch.cuda.synchronize()
    with torch.no_grad():
        t0 = time.perf_counter()
        if compiler == "kiln":
            import kiln

            compiled = kiln.compile(fn, mode="reduce-overhead" if "reduce-overhead" in name else "default")
        else:
            compiled = torch.compile(fn, mode="reduce-overhead" if "reduce-overhead" in name else "default")
        compiled(*args)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled(*args)
        torch.cuda.synchronize()
        warm = time.perf_counter() - t0
    return {"first_call": first, "cold_compile": first - warm}


def fresh_process(case: str, compiler: str, env_vars: dict) -> tuple[dict | None, float]:
    """`one` in a new process with empty compiler caches: its result (None if it failed) and
    the process's wall time."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | env_vars
    for var in ("KILN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env[var] = tempfile.mkdtemp(prefix="gpu-cold-")
    t0 = time.perf_counter()
    command = [sys.executable, "-m", "benchmarks.gpu_cold", "--one", case, compiler]
    done = subprocess.run(command, env=env, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return None, wall
    return json.loads(done.stdout.strip().splitlines()[-1]), wall


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--one", nargs=2, metavar=("CASE", "COMPILER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return 0
    import torch

    from benchmarks.gpu import cases

    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    names = [c[0] for c in cases() if not wanted or any(w in c[0] for w in wanted)]
    torch.cuda.empty_cache()  # the cases' inputs, made here only for their names
    # Python's bytecode cache: an installed torch comes with one, and without it every new
    # process compiles torch's Python again (6.5 s of each fresh process on the H200 machine,
    # whose packages have none). A first process per compiler fills this one.
    bytecode = {"PYTHONPYCACHEPREFIX": tempfile.mkdtemp(prefix="gpu-cold-pycache-")}
    for compiler in ("kiln", "inductor"):
        fresh_process(names[0], compiler, bytecode)
    lines = ["| case | kiln cold compile s | Inductor cold compile s | kiln process s | Inductor process s |",
             "|---|---|---|---|---|"]
    for name in names:
        cells = {}
        for compiler in ("kiln", "inductor"):
            result, wall = fresh_process(name, compiler, bytecode)
            cells[compiler] = (f"{result['cold_compile']:.2f}" if result else "FAIL", f"{wall:.1f}")
        line = (f"| {name} | {cells['kiln'][0]} | {cells['inductor'][0]} | {cells['kiln'][1]} | "
                f"{cells['inductor'][1]} |")
        lines.append(line)
        print(line, flush=True)
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

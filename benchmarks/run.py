"""Benchmark kiln against eager PyTorch and Inductor on the CPU cases of benchmarks/cases.py.

    python -m benchmarks.run                                  # all cases, table to docs/benchmarks.md
    python -m benchmarks.run --cases rmsnorm_f32,gpt2 --repeat 50 --out /tmp/bench.md

For each case, in one process: check kiln's and Inductor's results against eager (a wrong
result is FAIL and is not timed); measure each compiler's cold compile (its first call minus
one run of what it compiled, with fresh empty caches); time the three variants interleaved, after warm-up,
and keep the median. Then a fresh subprocess compiles the case again with kiln on the same
kiln cache ("warm start"): it should build nothing.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# Both compilers start cold: fresh cache folders before torch (or Inductor) reads them.
# A warm-start child inherits its parent's folders instead.
if "--warm-start-child" not in sys.argv:
    for _var, _prefix in (("TORCHINDUCTOR_CACHE_DIR", "bench-inductor-"), ("KILN_CACHE_DIR", "bench-kiln-")):
        os.environ[_var] = tempfile.mkdtemp(prefix=_prefix)
        atexit.register(shutil.rmtree, os.environ[_var], ignore_errors=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.cases import CASES, CASES_BY_NAME, Case, Workload  # noqa: E402
from benchmarks.measure import (  # noqa: E402
    KilnWatch,
    check_close,
    copy_bandwidth,
    first_call,
    median_seconds,
    time_interleaved,
)
from benchmarks.report import CaseResult, WarmStart, print_table, write_markdown  # noqa: E402


def compile_with(compiler: str, fn):
    """A fresh compiled callable: Dynamo forgets earlier compiles so this one starts cold."""
    torch._dynamo.reset()
    if compiler == "inductor":
        return torch.compile(fn)
    import kiln

    return kiln.compile(fn)


def warm_up_dynamo() -> None:
    """Pay Dynamo's and AOTAutograd's one-time start-up before any compile is measured."""
    torch._dynamo.reset()
    torch.compile(lambda x: x.sin() + 1, backend="aot_eager")(torch.randn(8))


def one_line(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + 1


def measure_startup() -> dict[str, float]:
    """Each compiler's first compile in this process (a one-line function, cold caches): the
    one-time cost of imports, worker pools and headers, kept out of the per-case numbers."""
    x = torch.randn(1024)
    eager_once = median_seconds(one_line, (x,), runs=5)
    startup = {}
    for compiler in ("inductor", "kiln"):
        seconds, _ = first_call(compile_with(compiler, one_line), (x,))
        startup[compiler] = seconds - eager_once
    return startup


def bench_case(case: Case, repeat: int) -> CaseResult:
    work: Workload = case.make(False)
    result = CaseResult(case.name, case.description, work.nbytes)
    expected = work.fn(*work.args)
    first: dict[str, float] = {}

    inductor = compile_with("inductor", work.fn)
    first["inductor"], out = first_call(inductor, work.args)
    result.errors["inductor"] = check_close(out, expected)

    watch = KilnWatch()
    kiln_fn = compile_with("kiln", work.fn)
    with watch:
        first["kiln"], out = first_call(kiln_fn, work.args)
    result.errors["kiln"] = check_close(out, expected)
    result.kiln = watch.summary()

    # Dynamo's reset before kiln's compile dropped Inductor's compiled code: this call
    # compiles it again (warm, from Inductor's cache) so no timed call does.
    inductor(*work.args)
    variants = {"eager": work.fn}
    for name, fn in (("inductor", inductor), ("kiln", kiln_fn)):
        if result.errors[name] is None:
            variants[name] = fn
    result.seconds = time_interleaved(variants, work.args, repeat)
    # The first call compiled and then ran once: take the run away (the variant's own median,
    # or eager's when its result was wrong and it was not timed).
    for name, seconds in first.items():
        run_once = result.median(name) or result.median("eager")
        result.compile_s[name] = seconds - run_once
    return result


def warm_start(case_name: str) -> WarmStart:
    """Compile the case with kiln in a new process that shares this process's kiln cache."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--warm-start-child", case_name],
                          capture_output=True, text=True, env=dict(os.environ), timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return WarmStart(error=proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return WarmStart(process_s=wall, **data)


def warm_start_child(case_name: str) -> None:
    """Runs in the subprocess: one compile with kiln, its report as one JSON line."""
    work = CASES_BY_NAME[case_name].make(False)
    with torch.no_grad():
        warm_up_dynamo()
        watch = KilnWatch()
        compiled = compile_with("kiln", work.fn)
        with watch:
            seconds, _ = first_call(compiled, work.args)
    s = watch.summary()
    print(json.dumps(dict(first_call_s=seconds, kiln_pass_s=s.pass_seconds,
                          cache_hits=s.cache_hits, kernels=s.kernels)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(c.name for c in CASES),
                   help="comma-separated case names (default: all): " + ", ".join(CASES_BY_NAME))
    p.add_argument("--repeat", type=int, default=30, help="timed runs of each variant (median kept)")
    p.add_argument("--out", default="docs/benchmarks.md", help="markdown file to write ('' to skip)")
    p.add_argument("--no-warm-start", action="store_true", help="skip the warm-start subprocesses")
    p.add_argument("--warm-start-child", metavar="CASE", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.warm_start_child:
        warm_start_child(args.warm_start_child)
        return
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES_BY_NAME]
    if unknown:
        sys.exit(f"unknown case(s) {unknown}; known: {', '.join(CASES_BY_NAME)}")
    command = "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv)
    started = datetime.datetime.now()
    results = []
    with torch.no_grad():
        warm_up_dynamo()
        ceiling = copy_bandwidth()
        print("measuring each compiler's one-time start-up ...", flush=True)
        startup = measure_startup()
        print(f"start-up: inductor {startup['inductor']:.2f} s, kiln {startup['kiln']:.2f} s", flush=True)
        for name in names:
            print(f"[{name}] compiling and timing ...", flush=True)
            result = bench_case(CASES_BY_NAME[name], args.repeat)
            if not args.no_warm_start:
                result.warm = warm_start(name)
            print(result.one_line(), flush=True)
            results.append(result)
    print_table(results)
    if args.out:
        elapsed = (datetime.datetime.now() - started).total_seconds()
        write_markdown(args.out, results, command=command.strip(), started=started, copy_gbs=ceiling,
                       startup=startup, repeat=args.repeat, elapsed_s=elapsed)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

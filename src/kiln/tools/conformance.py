"""Conformance runner: every OpInfo of PyTorch's op_db, compiled by kiln vs eager.

    python -m kiln.tools.conformance [--ops NAME,...] [--dtypes float32,bfloat16,int]
                                     [--samples 3] [--mode per-op] [--jobs 1] [--out results.jsonl]
                                     [--table docs/conformance.md]

Each (op, dtype) gets one class, the worst over its samples (docs/conformance.md defines them):
    crash         kiln raised, or recorded an internal error (kiln.errors), or AOTAutograd failed
                  (or broke the graph) under kiln's decompositions where it passes under aot_eager
    mismatch      the compiled result differs from eager
    not captured  Dynamo broke the graph or failed where it does without kiln too; the graphs it
                  captured ran through kiln and the results were compared
    fallback pass equal to eager, with some ATen ops, or a whole graph kiln declines, run in ATen
    native pass   equal to eager, every op lowered by kiln
Samples that fail in eager are skipped. Ops run in worker processes: a worker that dies
(a segfault in a kernel) marks the op it was running as a crash and the sweep goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CLASSES = ("crash", "mismatch", "not captured", "fallback pass", "native pass")
DTYPES = {"float32": "torch.float32", "bfloat16": "torch.bfloat16", "int": "int"}


def op_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m kiln.tools.conformance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="", help="comma-separated op names (default: all of op_db)")
    p.add_argument("--dtypes", default="float32,bfloat16,int")
    p.add_argument("--samples", type=int, default=3, help="sample inputs per op and dtype")
    p.add_argument("--mode", default="per-op", choices=("per-op", "per-sample"),
                   help="per-op: one compiled function per op, every sample called through it with its "
                        "non-tensor arguments as arguments; per-sample: a fresh dynamic=False compile per "
                        "sample, non-tensor arguments as constants")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--timeout", type=int, default=120, help="seconds per (op, dtype)")
    p.add_argument("--out", default="conformance.jsonl", help="results, one JSON line per (op, dtype)")
    p.add_argument("--resume", action="store_true", help="keep results already in --out")
    p.add_argument("--table", default="", help="write the markdown summary here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    if args.worker:
        from kiln.tools.conformance_worker import serve

        return serve(args)
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = [s for s in args.ops.split(",") if s]
    names = [op_name(op) for op in op_db if not wanted or op_name(op) in wanted or op.name in wanted]
    done = _done(args.out) if args.resume else set()
    if not args.resume and os.path.exists(args.out):
        os.remove(args.out)
    jobs = [(n, d) for n in names for d in args.dtypes.split(",") if (n, d) not in done]
    t0 = time.time()
    _run_pool(jobs, args)
    print(f"{len(jobs)} (op, dtype) runs in {time.time() - t0:.0f} s -> {args.out}")
    if args.table:
        from kiln.tools.conformance_table import write_table

        write_table(args.out, args.table)
        print(f"table -> {args.table}")
    return 0


def _done(path: str) -> set:
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {(r["op"], r["dtype"]) for r in map(json.loads, f)}


def _run_pool(jobs: list, args) -> None:
    """Split the jobs into one contiguous slice per worker; restart a worker that dies."""
    slices = [jobs[k::args.jobs] for k in range(args.jobs)]
    procs = [_Worker(s, args) for s in slices if s]
    while procs:
        for w in list(procs):
            if not w.poll():
                procs.remove(w)
        time.sleep(0.2)


class _Worker:
    """One worker process fed a list of jobs on stdin; reports 'start' and result lines."""

    def __init__(self, jobs: list, args):
        self.jobs, self.args, self.current = list(jobs), args, None
        self._start()

    def _start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "kiln.tools.conformance",
            "--worker",
            "--samples",
            str(self.args.samples),
            "--mode",
            self.args.mode,
            "--timeout",
            str(self.args.timeout),
        ]
        with open(self.args.out + ".log", "a") as log:  # Dynamo's and kiln's own messages
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1
            )
        self.proc.stdin.write("".join(f"{n}\t{d}\n" for n, d in self.jobs))
        self.proc.stdin.close()

    def poll(self) -> bool:
        """Read what the worker said; False once it has finished all its jobs."""
        line = self.proc.stdout.readline()
        if line:
            msg = json.loads(line)
            if msg.get("start"):
                self.current = (msg["op"], msg["dtype"])
            else:
                self._record(msg)
            return True
        self.proc.wait()
        if self.current is not None:  # it died inside this job
            op, dtype = self.current
            self._record(
                {
                    "op": op,
                    "dtype": dtype,
                    "class": "crash",
                    "samples": 0,
                    "detail": f"worker process died (exit code {self.proc.returncode})",
                    "fallbacks": {},
                }
            )
            self._start()
            return True
        return False

    def _record(self, msg: dict) -> None:
        key = (msg["op"], msg["dtype"])
        self.jobs = [j for j in self.jobs if j != key]
        self.current = None
        with open(self.args.out, "a") as f:
            f.write(json.dumps(msg) + "\n")
        if msg["class"] in ("crash", "mismatch"):
            print(f"{msg['class']:>13}  {msg['op']} {msg['dtype']}: {msg['detail'][:200]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

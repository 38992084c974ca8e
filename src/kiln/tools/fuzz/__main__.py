"""`python -m kiln.tools.fuzz --seed S --n N [--jobs J] [--against inductor] [--target triton]`:
generate N programs, run each compiled against eager, shrink and report the failures."""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time

from kiln.tools.fuzz.grammar import KNOWN_BUGS, PROFILES
from kiln.tools.fuzz.runner import CLASSES, FAILURES


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m kiln.tools.fuzz", description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=100, help="number of programs")
    p.add_argument("--start", type=int, default=0, help="index of the first program")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (0: run in this process)")
    p.add_argument(
        "--against",
        default="kiln",
        choices=("kiln", "inductor", "eager", "aot_eager"),
        help="compiler under test; inductor calibrates the comparison",
    )
    p.add_argument(
        "--target",
        default="cpp",
        choices=("cpp", "triton"),
        help="kiln's code generator; triton runs in Triton's CPU interpreter",
    )
    p.add_argument(
        "--profile", choices=sorted(PROFILES), help="shapes: cpu (default for cpp), tiny (triton), wide"
    )
    p.add_argument("--no-exclusions", action="store_true", help="also generate programs of known bugs")
    p.add_argument("--shrink-seconds", type=float, default=60, help="time to shrink each failure (0: none)")
    p.add_argument("--timeout", type=int, default=120, help="seconds per program")
    p.add_argument("--out", help="write one JSON line per program here")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def jobs_for(args) -> list[dict]:
    profile = args.profile or ("tiny" if args.target == "triton" else "cpu")
    excluded = [] if args.no_exclusions else sorted(KNOWN_BUGS)
    return [
        {
            "seed": args.seed,
            "index": i,
            "against": args.against,
            "profile": profile,
            "excluded": excluded,
            "timeout": args.timeout,
            "shrink_seconds": args.shrink_seconds,
        }
        for i in range(args.start, args.start + args.n)
    ]


def signature(result: dict) -> str:
    """Failures with one cause usually share the class and the message's words."""
    detail = result.get("shrunk_detail") or result.get("detail", "")
    detail = re.sub(r"-?\d[\d.e+-]*", "#", detail)
    return f"{result['cls']}: {detail[:90]}"


def main(argv=None) -> int:
    args = _parse(argv)
    if args.serve:
        from kiln.tools.fuzz.pool import serve

        return serve()
    env = {"KILN_TARGET": "triton", "TRITON_INTERPRET": "1"} if args.target == "triton" else {}
    if args.jobs == 0 and env:
        import os

        os.environ.update(env)  # before kiln and Triton are imported
    from kiln.tools.fuzz.pool import run_jobs

    out = open(args.out, "w") if args.out else None  # noqa: SIM115 - written as results come
    counts: collections.Counter = collections.Counter()
    fallbacks: collections.Counter = collections.Counter()
    failures: dict[str, list[dict]] = collections.defaultdict(list)
    t0 = time.time()

    def on_result(result: dict) -> None:
        counts[result["cls"]] += 1
        fallbacks.update(result.get("fallbacks", []))
        if result["cls"] in (*FAILURES, "fuzzer error"):
            failures[signature(result)].append(result)
            print(f"program {result['index']}: {result['cls']}: {result.get('detail', '')[:200]}", flush=True)
        if out:
            out.write(json.dumps(result) + "\n")
            out.flush()
        done = sum(counts.values())
        if done % 50 == 0:
            print(f"[{done}/{args.n}, {time.time() - t0:.0f} s] {dict(counts)}", flush=True)

    run_jobs(jobs_for(args), args.jobs, on_result, env)
    if out:
        out.close()
    print(_summary(args, counts, fallbacks, failures, time.time() - t0))
    return 1 if failures else 0


def _summary(args, counts, fallbacks, failures, seconds: float) -> str:
    run = f"seed {args.seed}, against {args.against}, target {args.target}"
    lines = [f"\n{sum(counts.values())} programs ({run}) in {seconds:.0f} s"]
    lines += [f"  {cls}: {counts[cls]}" for cls in CLASSES + ("eager fails", "fuzzer error") if counts[cls]]
    if fallbacks:
        lines.append(
            "ATen fallbacks (kind: op): " + ", ".join(f"{k} x{n}" for k, n in fallbacks.most_common(12))
        )
    for sig, results in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        first = results[0]
        lines += [
            "",
            f"== {len(results)} x {sig}",
            f"programs {[r['index'] for r in results][:20]}",
            first.get("shrunk_detail") or first.get("detail", ""),
            first.get("shrunk") or first.get("source", ""),
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

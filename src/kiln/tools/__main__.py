"""The `kiln` command: demo, explain, check, cache, bench."""

from __future__ import annotations

import argparse
import sys


def _cache(args) -> int:
    from pathlib import Path

    from kiln.options import env_cache_dir
    from kiln.tools import cache_cli

    root = Path(env_cache_dir())
    if args.action == "clear":
        print(cache_cli.clear(root, args.older_than))
    elif args.action == "why":
        print(cache_cli.why(root, args.count))
    else:
        print(cache_cli.ls(root))
    return 0


def _explain(args) -> int:
    import torch

    from kiln.tools.demo import Block
    from kiln.tools.explain import explain

    torch.manual_seed(0)
    with torch.no_grad():
        explanation = explain(Block().eval(), torch.randn(2, 16, 256), show_kernels=True,
                              show_source=args.source, measure=args.measure)
    if args.html:
        print(f"wrote {explanation.save_html(args.html, title='kiln report: the demo block')}")
    else:
        print(explanation)
    return 0


def _check(args) -> int:
    """Run a script as `python script.py args` would, every kiln graph's numerics checked at its
    first call (docs/numerics_check.md); 1 when a kernel was over tolerance."""
    import os
    import runpy

    from kiln.tools import check

    os.environ["KILN_CHECK"] = "1"  # read by kiln's options in the script's compiles
    sys.argv = [args.script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    before = len(check.RESULTS)
    status = 0
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    results = check.RESULTS[before:]
    bad = [r for r in results if not r.ok]
    launches = sum(r.checked for r in results)
    print(f"kiln check: {len(results)} graphs, {launches} launches compared, {len(bad)} graphs with a kernel "
          f"over tolerance" + (f": first {bad[0].kernel}" if bad else ""), file=sys.stderr)
    return 1 if bad else status


def _bench(args) -> int:
    import runpy

    sys.argv = ["benchmarks.run", *args.rest]
    runpy.run_module("benchmarks.run", run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kiln", description="kiln, a compiler for PyTorch programs")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="compile a small transformer block, check it and time it")
    ex = sub.add_parser("explain", help="show passes, fusion decisions and kernels of the demo block")
    ex.add_argument("--source", action="store_true", help="also print the generated C++ and host code")
    ex.add_argument("--measure", action="store_true",
                    help="also time eager, the compiled call and each kernel (roofline, break-even)")
    ex.add_argument("--html", metavar="PATH", help="write the explanation as one self-contained HTML page "
                                                   "(roofline, kernel table, passes, fusion graphs) instead")
    check = sub.add_parser("check", help="run a script with kiln's numerics check on; exit 1 when a kernel "
                                          "is over tolerance")
    check.add_argument("script", help="the Python script to run")
    check.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    cache = sub.add_parser("cache", help="list kiln's cache entries, explain its misses, or clear it")
    cache.add_argument("action", nargs="?", choices=["ls", "why", "clear", "info"], default="ls",
                       help="ls: entries with size, age and hits (info: the same); why: for the latest "
                            "misses, the nearest entry and the key components that differ; clear: remove")
    cache.add_argument("--older-than", type=float, metavar="DAYS",
                       help="clear: only entries unused for this many days")
    cache.add_argument("--count", type=int, default=5, help="why: how many of the latest misses")
    bench = sub.add_parser("bench", help="run benchmarks/ (from a source checkout)")
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from kiln.tools.demo import main as demo

        return demo()
    return {"explain": _explain, "check": _check, "cache": _cache, "bench": _bench}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

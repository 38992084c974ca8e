"""The cost model against measured kernel times: `python -m benchmarks.cost_check [case ...]`.

For each case (benchmarks/cases.py, the CPU cases; or the GPU kernel cases with --gpu), kiln.explain
with measure=True; per kernel, the predicted time, the measured time (the fastest launch) and the
prediction's error relative to the measured time."""

from __future__ import annotations

import argparse
import sys

import torch


def check(name: str, fn, args: tuple) -> list[tuple[str, str, float, float, str]]:
    import kiln

    torch._dynamo.reset()
    with torch.no_grad():
        explanation = kiln.explain(fn, *args, measure=True, show_kernels=False)
    rows = []
    for g in explanation.graphs:
        for k in g.kernels:
            if k.cost is not None and k.measured_s:
                rows.append((name, k.name, k.cost.seconds, k.measured_s, k.cost.bound))
    return rows


def main(argv: list[str] | None = None) -> int:
    from benchmarks.cases import CASES

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="*", help="case names (default: all CPU cases)")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke run)")
    parsed = parser.parse_args(argv)
    chosen = [c for c in CASES if not parsed.cases or c.name in parsed.cases]
    print("| case | kernel | bound | predicted us | measured us | error |")
    print("|---|---|---|---|---|---|")
    for case in chosen:
        work = case.make(parsed.small)
        for name, kernel, predicted, measured, bound in check(case.name, work.fn, work.args):
            error = (predicted - measured) / measured
            print(f"| {name} | {kernel} | {bound} | {predicted * 1e6:.1f} | {measured * 1e6:.1f} "
                  f"| {error:+.0%} |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

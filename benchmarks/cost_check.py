"""The cost model against measured kernel times: `python -m benchmarks.cost_check [case ...]`.

For each case (benchmarks/cases.py, the CPU cases; or the GPU kernel table's memory-bound cases,
benchmarks/gpu.py, with --gpu), kiln.explain
with measure=True; per kernel, the predicted time, the measured time (the fastest launch) and the
prediction's error relative to the measured time. --repeat N runs every case N times and reports
the median of each kernel's predicted and measured times (a shared machine's speed drifts);
--measure-ceilings measures the ceilings again in this process first, instead of reading them
from kiln's cache (where they were measured at another time)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

# the joint (training) cache's hits load their programs without the cost model's estimate
os.environ.setdefault("KILN_JOINT_CACHE", "0")


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


def workloads(gpu: bool, names: list[str], small: bool):
    """(name, fn, args) of the chosen cases: the CPU cases, or the GPU table's memory-bound ones."""
    if gpu:
        from benchmarks.gpu import cases

        for name, fn, args, nbytes, _, _ in cases():
            if nbytes is not None and (not names or any(n in name for n in names)):
                yield name, fn, args
        return
    from benchmarks.cases import CASES

    for case in CASES:
        if not names or case.name in names:
            work = case.make(small)
            yield case.name, work.fn, work.args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke run)")
    parser.add_argument("--gpu", action="store_true", help="the GPU kernel table's memory-bound cases")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case (medians reported)")
    parser.add_argument("--measure-ceilings", action="store_true",
                        help="measure the ceilings in this process (and cache them)")
    parsed = parser.parse_args(argv)
    device = torch.device("cuda" if parsed.gpu else "cpu")
    from kiln.passes.roofline import Ceilings

    if parsed.measure_ceilings:
        from kiln.runtime import ceilings

        ceilings.forget(device)
    print(Ceilings.for_device(device))
    print("| case | kernel | bound | predicted us | measured us | error |")
    print("|---|---|---|---|---|---|")
    for case_name, fn, args in workloads(parsed.gpu, parsed.cases, parsed.small):
        runs = [check(case_name, fn, args) for _ in range(max(parsed.repeat, 1))]
        for row in runs[0]:
            name, kernel, _, _, bound = row
            same = [r for rows in runs for r in rows if r[1] == kernel]
            predicted = statistics.median(r[2] for r in same)
            measured = statistics.median(r[3] for r in same)
            error = (predicted - measured) / measured
            print(f"| {name} | {kernel} | {bound} | {predicted * 1e6:.1f} | {measured * 1e6:.1f} "
                  f"| {error:+.0%} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

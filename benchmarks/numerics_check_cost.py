"""What the numerics check costs: the first call (compile + run) of a program unchecked and
checked, each in a fresh process, the graph cache off in both (checked graphs skip it), and
what the check found.

    python -m benchmarks.numerics_check_cost [--repeat 3] [--cases demo gpt2_train]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, sys, time
import torch
import kiln
from kiln.tools import check

case, checked = sys.argv[1], sys.argv[2] == "1"
if case == "demo":
    from kiln.tools.demo import Block
    torch.manual_seed(0)
    fn, args = Block().eval(), (torch.randn(2, 16, 256),)
    run = lambda f: f(*args)
    compiled = kiln.compile(fn, check=checked)
    with torch.no_grad():
        t0 = time.perf_counter(); run(compiled); seconds = time.perf_counter() - t0
else:
    from benchmarks.cases import CASES_BY_NAME
    work = CASES_BY_NAME[case].make(False)
    compiled = kiln.compile(work.fn, check=checked)
    t0 = time.perf_counter(); compiled(*work.args); seconds = time.perf_counter() - t0
results = check.RESULTS
print(json.dumps({"seconds": seconds, "graphs": len(results), "launches": sum(r.checked for r in results),
                  "skipped": sum(len(r.skipped) for r in results),
                  "over": [r.kernel for r in results if not r.ok]}))
"""


def first_call(case: str, checked: bool) -> dict:
    env = {**os.environ, "KILN_GRAPH_CACHE": "0", "HF_HUB_OFFLINE": "1"}
    env.pop("KILN_CHECK", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, case, "1" if checked else "0"], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["demo", "gpt2_train"])
    args = parser.parse_args()
    print("| program | first call unchecked (s) | first call checked (s) | launches checked | skipped "
          "| over |")
    print("|---|---|---|---|---|---|")
    for case in args.cases:
        plain = [first_call(case, False)["seconds"] for _ in range(args.repeat)]
        runs = [first_call(case, True) for _ in range(args.repeat)]
        checked = [r["seconds"] for r in runs]
        last = runs[-1]
        print(f"| {case} | {statistics.median(plain):.2f} | {statistics.median(checked):.2f} | "
              f"{last['launches']} | {last['skipped']} | {', '.join(last['over']) or 'none'} |")


if __name__ == "__main__":
    main()

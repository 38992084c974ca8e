"""The demo block's first call in a fresh process, cold (empty kiln cache) and warm (the cache
the cold run filled): inference and one training step (forward and backward).

    python -m benchmarks.warm_start [--runs 3] [--precompile]

Each measurement is its own process; `import torch` and `import kiln` are timed apart from
the first call (compile + run), which includes Dynamo, AOTAutograd and kiln. --precompile: with
Dynamo's caching precompile (TORCH_CACHING_PRECOMPILE=1; its cache beside kiln's), so that a warm
process runs no tracing at all."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
import kiln
from kiln.frontend.reports import REPORTS
from kiln.tools.demo import Block
imported = time.perf_counter() - t0
torch.manual_seed(0)
training = sys.argv[1] == "train"
model = Block().train(training)
x = torch.randn(2, 64, 256)
t1 = time.perf_counter()  # Dynamo's precompile cache is loaded when the module is wrapped
compiled = kiln.compile(model)
if training:
    compiled(x).sum().backward()
else:
    with torch.no_grad():
        compiled(x)
first = time.perf_counter() - t1
passes = sum(p.seconds for r in REPORTS[:] for p in r.passes)
cached = sum(1 for r in REPORTS[:] if getattr(r, "from_cache", ""))
print(json.dumps({"import": imported, "first_call": first, "kiln_passes": passes,
                  "graphs": len(REPORTS), "graphs_from_cache": cached}))
"""


def run(kind: str, cache_dir: str, precompile: bool) -> dict:
    env = {**os.environ, "KILN_CACHE_DIR": cache_dir}
    if precompile:
        env.update(TORCH_CACHING_PRECOMPILE="1", TORCHINDUCTOR_CACHE_DIR=str(Path(cache_dir) / "torch"))
    proc = subprocess.run([sys.executable, "-c", CHILD, kind], env=env, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--precompile", action="store_true")
    args = parser.parse_args()
    for kind in ("infer", "train"):
        with tempfile.TemporaryDirectory(prefix="kiln-warm-") as cache_dir:
            cold = run(kind, cache_dir, args.precompile)
            warm = [run(kind, cache_dir, args.precompile) for _ in range(args.runs)]
        median = {k: statistics.median(w[k] for w in warm) for k in ("import", "first_call", "kiln_passes")}
        print(f"{kind}: cold first call {cold['first_call']:.2f} s (passes {cold['kiln_passes']:.3f} s); "
              f"warm first call median {median['first_call']:.2f} s "
              f"(runs {', '.join(format(w['first_call'], '.2f') for w in warm)}), kiln passes "
              f"{median['kiln_passes']:.3f} s, import {median['import']:.2f} s, "
              f"graphs {warm[0]['graphs']} of which from the graph cache {warm[0]['graphs_from_cache']}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()

"""`kiln.load` and the first call of an exported GPT-2 (124M) forward in a fresh process.

    PYTHONPATH=src python -m benchmarks.artifact_load [--small] [--runs 5] [--device cuda]

One process exports the model (kiln.export: torch.export, then kiln; on a GPU the artifact
holds the kernels' cubins) and saves eager's logits for fresh inputs. Then, after one
process that only fills Python's bytecode caches, each run is a fresh process that times
`import torch` apart from `import kiln` + `kiln.load` + the first call (synchronized), checks
the logits against eager's and reports which of Triton, Dynamo and Inductor it imported.
--small: a 2-layer GPT-2, for a check on the CPU."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

EXPORT = r"""
import sys, torch
import kiln
from transformers import GPT2Config, GPT2LMHeadModel
path, small, device = sys.argv[1], sys.argv[2] == "small", torch.device(sys.argv[3])
torch.manual_seed(0)
size = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=128) if small else \
    dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50304, n_positions=1024)
config = GPT2Config(**size, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
model = GPT2LMHeadModel(config).to(device).eval()

class Logits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids).logits

batch, seq = (2, 64) if small else (1, 1024)
ids = torch.randint(0, size["vocab_size"], (batch, seq), device=device)
kiln.export(Logits(model), (ids,), path)
fresh = torch.randint(0, size["vocab_size"], (batch, seq), device=device)
with torch.no_grad():
    torch.save({"ids": fresh, "expected": Logits(model)(fresh)}, path + ".io.pt")
"""

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
imported = time.perf_counter() - t0
path = sys.argv[1]
io = torch.load(path + ".io.pt")
sync = torch.cuda.synchronize if io["ids"].is_cuda else (lambda: None)
sync()
t1 = time.perf_counter()
import kiln
program = kiln.load(path)
loaded = time.perf_counter() - t1
out = program(io["ids"])
sync()
first = time.perf_counter() - t1
torch.testing.assert_close(out, io["expected"], rtol=1e-3, atol=1e-3)
modules = {name: any(m == name or m.startswith(name + ".") for m in sys.modules)
           for name in ("triton", "triton.compiler", "torch._dynamo", "torch._inductor", "sympy")}
print(json.dumps({"import_torch": imported, "load": loaded, "load_and_first_call": first,
                  "imported": modules}))
"""


def _run(script: str, *argv: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-artifact-") as folder:
        path = str(Path(folder) / "gpt2.kiln")
        os.environ["KILN_CACHE_DIR"] = str(Path(folder) / "cache")
        _run(EXPORT, path, "small" if args.small else "full", args.device)
        _run(CHILD, path)  # fills the bytecode caches of what loading imports
        runs = [json.loads(_run(CHILD, path).strip().splitlines()[-1]) for _ in range(args.runs)]
    keys = ("import_torch", "load", "load_and_first_call")
    median = {k: statistics.median(r[k] for r in runs) for k in keys}
    imported = [name for name, yes in runs[0]["imported"].items() if yes]
    print(f"GPT-2 {'2-layer' if args.small else '124M'} forward artifact on {args.device}: "
          f"kiln.load + first call median {median['load_and_first_call']:.3f} s beyond import torch "
          f"({median['import_torch']:.2f} s); import kiln + kiln.load {median['load']:.3f} s; runs "
          f"{', '.join(format(r['load_and_first_call'], '.3f') for r in runs)}; "
          f"imported: {', '.join(imported) or 'none of triton, dynamo, inductor, sympy'}")


if __name__ == "__main__":
    main()

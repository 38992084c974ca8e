"""Dynamo's caching precompile with kiln: a warm process traces nothing and trains like eager.

The cold process compiles the demo block, trains two steps beside an eager copy and saves
(kiln saves Dynamo's cache at exit). The warm process, where Dynamo's tracing and AOTAutograd
raise, must load the function from Dynamo's cache and each graph's programs from kiln's, and
match eager again. A graph whose programs were made by another kiln is compiled again at its
first call and still matches eager."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("torch._dynamo.precompile_context")

SRC = str(Path(__file__).resolve().parents[2] / "src")

CHILD = r"""
import copy, json, sys
import torch
import torch._dynamo.symbolic_convert as symbolic_convert
import torch._functorch.aot_autograd as aot_autograd
import kiln
from kiln.runtime import training_cache
from kiln.tools.demo import Block

forbid = sys.argv[1] == "warm"
def forbidden(*args, **kwargs):
    raise AssertionError("traced in the warm process")
if forbid:
    aot_autograd.aot_module_simplified = forbidden
    symbolic_convert.InstructionTranslator.run = forbidden

torch.manual_seed(0)
model = Block(dim=32, heads=2, hidden=48)
reference = copy.deepcopy(model)
compiled = kiln.compile(model)
optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
torch.manual_seed(int(sys.argv[2]))
worst = 0.0
for step in range(2):
    x = torch.randn(2, 8, 32)
    for opt in optimizers:
        opt.zero_grad()
    out, ref = compiled(x), reference(x)
    worst = max(worst, (out - ref).abs().max().item())
    out.square().mean().backward()
    ref.square().mean().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        worst = max(worst, (p.grad - q.grad).abs().max().item())
    for opt in optimizers:
        opt.step()
print(json.dumps({"worst": worst, "joint": dict(training_cache.STATS),
                  "dynamo": dict(torch._dynamo.utils.counters["dynamo_cache"])}))
"""


def _run(phase: str, seed: int, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, phase, str(seed)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(tmp_path: Path) -> dict:
    return {**os.environ, "PYTHONPATH": SRC, "TORCH_CACHING_PRECOMPILE": "1", "KILN_TARGET": "cpp",
            "KILN_CACHE_DIR": str(tmp_path / "kiln"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}


def test_a_warm_process_traces_nothing_and_trains_like_eager(env: dict):
    cold = _run("cold", 1, env)
    assert cold["worst"] < 1e-4, cold
    assert cold["dynamo"].get("dynamo_cache_miss") == 1 and cold["joint"].get("stored") == 1, cold
    warm = _run("warm", 2, env)
    assert warm["worst"] < 1e-4, warm
    assert warm["dynamo"].get("dynamo_cache_hit") == 1, warm
    assert warm["joint"] == {"precompiled": 1}, warm


def test_programs_of_another_kiln_are_compiled_again_and_match_eager(tmp_path: Path):
    from kiln.frontend import precompile
    from kiln.options import Options

    gm = torch.fx.symbolic_trace(lambda x, y: (torch.nn.functional.gelu(x @ y) + 1,))
    options = Options()
    content = {"joint": "joint_0", "components": {"kiln source": "another"}, "options": options,
               "target": "cpp", "device": "cpu", "graph": __import__("pickle").dumps(gm)}
    fn = precompile.KilnArtifact("__compiled_fn_1", content).after_deserialization()
    x, y = torch.randn(5, 7), torch.randn(7, 3)
    out = fn(x, y)
    out = out[0] if isinstance(out, (list, tuple)) else out
    torch.testing.assert_close(out, torch.nn.functional.gelu(x @ y) + 1)

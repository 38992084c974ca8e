"""The joint cache: a warm process trains without AOTAutograd, each step matching eager.

Each process trains models for two steps (SGD) beside an eager copy, on inputs drawn with
its own seed, and checks losses, gradients and buffers against eager at every step. The cold
process fills the cache; a warm process, where AOTAutograd raises, must run every cached
graph from the cache; graphs whose calling convention is not plain (a BatchNorm updating its
running statistics mutates an input) take AOTAutograd's path and still train like eager."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kiln.runtime import cache, training_cache
from kiln.tools import cache_cli

SRC = str(Path(__file__).resolve().parents[2] / "src")

# argv: a JSON list of phases {"model", "dtype", "shape", "x_grad", "forbid_aot"} and a seed.
# Prints, per phase, what the joint cache did and how often AOTAutograd was called.
CHILD = r"""
import copy, json, logging, sys
import torch
import torch._functorch.aot_autograd as aot_autograd
import kiln
from kiln.runtime import training_cache
from kiln.tools.demo import Block

warnings = []
class Collect(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(f"{record.name}: {record.getMessage()}")
logging.getLogger("kiln").addHandler(Collect())

state = {"forbid": False, "calls": 0}
real_aot = aot_autograd.aot_module_simplified
def spied_aot(*args, **kwargs):
    state["calls"] += 1
    if state["forbid"]:
        raise AssertionError("AOTAutograd ran in the warm process")
    return real_aot(*args, **kwargs)
aot_autograd.aot_module_simplified = spied_aot

def make(name):
    if name == "block":
        return Block(dim=32, heads=2, hidden=48)
    if name == "mlp":
        # Flatten: the output is the only view of an intermediate (returned through _unsafe_view)
        return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.LayerNorm(40), torch.nn.GELU(),
                                   torch.nn.Linear(40, 24), torch.nn.LayerNorm(24), torch.nn.Flatten(0))
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.BatchNorm1d(40), torch.nn.ReLU(),
                               torch.nn.Linear(40, 24))

def shape_of(name, shape):
    return shape or ([2, 8, 32] if name == "block" else [16, 24])

phases, seed = json.loads(sys.argv[1]), int(sys.argv[2])
results = []
for phase in phases:
    torch._dynamo.reset()
    dtype = getattr(torch, phase.get("dtype", "float32"))
    torch.manual_seed(0)
    model = make(phase["model"]).to(dtype)
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    before, calls = dict(training_cache.STATS), state["calls"]
    state["forbid"] = phase.get("forbid_aot", False)
    torch.manual_seed(seed)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)
    for step in range(2):
        x = torch.randn(shape_of(phase["model"], phase.get("shape")), dtype=dtype)
        target = torch.randn_like(x)
        got = []
        for fn, m, opt in ((compiled, model, optimizers[0]), (reference, reference, optimizers[1])):
            xi = x.clone().requires_grad_(phase.get("x_grad", False))
            out = fn(xi)
            loss = (out - target.reshape(out.shape)).square().mean()
            loss.backward()
            got.append([loss.detach(), *(p.grad.clone() for p in m.parameters()),
                        *(b.clone() for b in m.buffers()), *([xi.grad] if xi.requires_grad else [])])
            opt.step()
            opt.zero_grad()
        for a, b in zip(*got, strict=True):
            torch.testing.assert_close(a, b, **tol)
    state["forbid"] = False
    after = training_cache.STATS
    results.append({"stats": {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)},
                    "aot_calls": state["calls"] - calls})
print(json.dumps({"phases": results, "warnings": warnings}))
"""


def run_child(root: Path, phases: list[dict], seed: int) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC, "KILN_CACHE_DIR": str(root), "KILN_TARGET": "cpp"}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(phases), str(seed)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


PLAIN = [{"model": "block"}, {"model": "mlp"}]
MUTATING = {"model": "batchnorm"}
NOT_PLAIN = "the graph mutates an input (e.g. a running statistic)"


VARIANTS = [{"model": "mlp", "x_grad": True}, {"model": "mlp", "dtype": "float64"},
            {"model": "mlp", "shape": [12, 24]}]


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> tuple[Path, dict]:
    """A cache filled by a cold process training every model."""
    root = tmp_path_factory.mktemp("joint") / "cache"
    return root, run_child(root, [*PLAIN, MUTATING], seed=1)


@pytest.fixture(scope="module")
def warm(cold) -> dict:
    """A warm process (AOTAutograd raises while the plain models train), then variants."""
    root, _ = cold
    return run_child(root, [*({**p, "forbid_aot": True} for p in PLAIN), MUTATING, *VARIANTS], seed=2)


def test_cold_process_stores_plain_graphs_and_says_why_not_the_others(cold):
    root, run = cold
    assert run["warnings"] == []
    for phase in run["phases"][:2]:
        assert phase == {"stats": {"miss": 1, "stored": 1}, "aot_calls": 1}, phase
    mutating = run["phases"][2]
    assert mutating == {"stats": {"miss": 1, f"not cached: {NOT_PLAIN}": 1}, "aot_calls": 1}, mutating
    assert f"not cacheable: {NOT_PLAIN}" in cache_cli.why(root, count=100)


def test_warm_process_trains_without_aot_autograd(warm):
    assert warm["warnings"] == []
    for phase in warm["phases"][:2]:
        assert phase == {"stats": {"hit": 1}, "aot_calls": 0}, phase
    assert warm["phases"][2] == {"stats": {"miss": 1, f"not cached: {NOT_PLAIN}": 1}, "aot_calls": 1}


def test_requires_grad_dtype_and_shape_changes_miss(cold, warm):
    for phase in warm["phases"][3:]:
        assert phase == {"stats": {"miss": 1, "stored": 1}, "aot_calls": 1}, phase
    why = cache_cli.why(cold[0], count=100)
    for difference in (r"input \d+ requires_grad: False there, True here",
                       r"input \d+ dtype: torch.float32 there, torch.float64 here",
                       r"input \d+ shape: \[16, 24\] there, \[12, 24\] here"):
        assert re.search(difference, why), why


def test_corrupt_entry_is_rebuilt_with_a_warning(cold, tmp_path):
    root = tmp_path / "cache"
    shutil.copytree(cold[0], root)
    entries = [p for p in (root / training_cache.FOLDER).iterdir() if p.is_dir()]
    for entry in entries:  # only the MLP's is read
        convention = entry / training_cache.CONVENTION
        convention.write_text(convention.read_text()[:-7])
    run = run_child(root, [{"model": "mlp"}], seed=5)
    (warning,) = run["warnings"]
    assert "cached joint" in warning and "rebuilding" in warning, warning
    assert run["phases"] == [{"stats": {"miss": 1, "stored": 1}, "aot_calls": 1}]
    keys = {e: e.name.split("_")[1] for e in entries}
    whole = [e for e in entries if cache.check(cache.Entry(training_cache.KIND, keys[e], e, {})) is None]
    assert len(whole) == 1  # the MLP's, rebuilt


def test_convention_needs_the_backward_to_read_only_saved_values_and_tangents():
    class Meta:
        input_info, output_info, num_intermediate_bases = [], [], 0

    split = training_cache._Split(num_user_outputs=0, saved=("mm",), backward_placeholders=("mm", "other"),
                                  num_forward_inputs=0, meta=Meta(), forward_entry="graph_a")
    with pytest.raises(training_cache.NotPlain, match="reads other"):
        training_cache.convention_of(split, 0, "graph_b")
    split.backward_placeholders = ("mm",)
    assert training_cache.convention_of(split, 0, "graph_b").backward_inputs == (("saved", 0),)


def test_graph_mode_change_is_a_key_component():
    device = torch.device("cpu")
    with torch.no_grad():
        off = training_cache._modes(device)
    assert off["grad enabled"] == "False" and training_cache._modes(device)["grad enabled"] == "True"



def test_cached_program_failing_at_first_call_runs_in_aten(cold, tmp_path, monkeypatch, caplog):
    root = tmp_path / "cache"
    shutil.copytree(cold[0], root)
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    monkeypatch.setenv("KILN_TARGET", "cpp")

    def broken(*args):
        raise RuntimeError("a kernel that does not load")

    monkeypatch.setattr(training_cache._Step, "apply", broken)
    import kiln
    from kiln.tools.demo import Block

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, before = Block(dim=32, heads=2, hidden=48), dict(training_cache.STATS)
    reference = Block(dim=32, heads=2, hidden=48)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 32)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        kiln.compile(model)(x).square().mean().backward()
    assert training_cache.STATS["hit"] == before.get("hit", 0) + 1
    assert any("failed at its first call" in r.getMessage() for r in caplog.records)
    reference(x).square().mean().backward()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)

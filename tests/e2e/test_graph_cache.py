"""The whole-graph cache: a warm process loads each graph's program without running a kiln
pass or a compiler and matches eager; everything that changes the program changes the key,
and `kiln cache why` names what changed. Warm runs are fresh processes, checked against eager
on inputs drawn with another seed than the cold run's."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_same

from kiln.runtime import cache, graph_cache
from kiln.tools import cache_cli

SRC = str(Path(__file__).resolve().parents[2] / "src")

# Compiles a small block (inference, or one training step), checks it against eager and
# prints what the graph cache did. With KILN_FORBID_PASSES set, kiln's pass pipeline raises.
CHILD = r"""
import json, logging, os, sys
import torch
import kiln
import kiln.passes.pipeline as pipeline
from kiln.frontend.backend import REPORTS
from kiln.runtime import graph_cache

warnings = []
class Collect(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(f"{record.name}: {record.getMessage()}")
logging.getLogger("kiln").addHandler(Collect())
if os.environ.get("KILN_FORBID_PASSES"):
    def forbidden(*args, **kwargs):
        raise AssertionError("a kiln pass ran in the warm process")
    pipeline.compile_graph = forbidden

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(48)
        self.up, self.down = torch.nn.Linear(48, 96), torch.nn.Linear(96, 48)
    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return (x + h).softmax(-1).cumsum(1)

torch.manual_seed(0)
model = Block()
torch.manual_seed(int(sys.argv[2]))
x = torch.randn(4, 10, 48)
compiled = kiln.compile(model)
if sys.argv[1] == "train":
    x.requires_grad_(True)
    out = compiled(x)
    grad = torch.randn_like(out)
    out.backward(grad)
    got = [out.detach(), x.grad] + [p.grad for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    expected_out = model(x)
    expected_out.backward(grad)
    expected = [expected_out.detach(), x.grad] + [p.grad for p in model.parameters()]
else:
    with torch.no_grad():
        got, expected = [compiled(x)], [model(x)]
for a, b in zip(got, expected):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
print(json.dumps({"graphs": len(REPORTS), "from_cache": [r.from_cache for r in REPORTS[:]],
                  "stats": dict(graph_cache.STATS), "warnings": warnings}))
"""


def run_child(cache_dir: Path, kind: str, seed: int, **env) -> dict:
    full_env = {**os.environ, "PYTHONPATH": SRC, "KILN_CACHE_DIR": str(cache_dir), "KILN_TARGET": "cpp",
                **env}
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, str(seed)], env=full_env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def compiler_spy(tmp_path):
    """A C++ compiler that answers --version as g++ does (a key component) and records any
    other call, failing it: a warm run must not compile."""
    calls = tmp_path / "compiler_calls"
    script = tmp_path / "spy-g++"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then exec {shutil.which("g++")} --version; fi\n'
                      f'echo "$@" >> {calls}\nexit 1\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, calls


TARGETS = {"cpp": {}, "triton": {"KILN_TARGET": "triton", "TRITON_INTERPRET": "1"}}


@pytest.mark.parametrize("target, kind", [("cpp", "infer"), ("cpp", "train"), ("triton", "infer")])
def test_warm_process_runs_no_pass_and_no_compiler(tmp_path, compiler_spy, target, kind):
    root = tmp_path / "cache"
    cold = run_child(root, kind, seed=1, **TARGETS[target])
    graphs = 2 if kind == "train" else 1
    assert cold["stats"] == {"miss": graphs} and cold["warnings"] == []
    script, calls = compiler_spy
    warm = run_child(root, kind, seed=2, CXX=str(script), KILN_FORBID_PASSES="1", **TARGETS[target])
    assert warm["stats"] == {"hit": graphs}, warm
    assert all(warm["from_cache"]) and len(warm["from_cache"]) == graphs
    assert warm["warnings"] == []
    assert not calls.exists(), f"the warm run compiled: {calls.read_text()}"


def _compile_in_process(monkeypatch, root: Path, fn, *args, **options):
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    torch._dynamo.reset()
    import kiln

    with torch.no_grad():
        out = kiln.compile(fn, **options)(*args)
    assert_same(out, fn(*args))


def _graph_events(root: Path, event: str) -> list[dict]:
    lines = cache.read_journal(root)
    return [line for line in lines if (line.get("kind"), line["event"]) == ("graph", event)]


def _misses(root: Path) -> list[dict]:
    return _graph_events(root, "miss")


def test_cumsum_dims_get_their_own_entries_and_why_names_the_line(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    x = torch.randn(6, 7)
    _compile_in_process(monkeypatch, root, lambda t: torch.cumsum(t, 0) * 2, x)
    _compile_in_process(monkeypatch, root, lambda t: torch.cumsum(t, 1) * 2, x)
    assert len([p for p in (root / "graph").iterdir() if p.is_dir()]) == 2
    assert len(_misses(root)) == 2
    text = cache_cli.why(root)
    assert "graph text line" in text and "aten::cumsum.default(v0, 0)" in text, text
    aten_lines = [part for part in text.split("graph text line") if "aten::" in part]  # not Dynamo's (joint)
    assert "aten::cumsum.default(v0, 1)" in aten_lines[-1], text


def test_option_and_stride_changes_miss_and_why_names_them(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    x = torch.randn(9, 5)

    def f(t):
        return torch.sigmoid(t) * t + 1

    _compile_in_process(monkeypatch, root, f, x)
    _compile_in_process(monkeypatch, root, f, x)  # a fresh Dynamo: the same graph hits
    assert len(_graph_events(root, "hit")) == 1 and len(_misses(root)) == 1
    _compile_in_process(monkeypatch, root, f, x, mode="max-autotune")
    assert len(_misses(root)) == 2
    assert "option mode: default there, max-autotune here" in cache_cli.why(root, count=1)
    _compile_in_process(monkeypatch, root, f, torch.randn(5, 9).t())
    assert len(_misses(root)) == 3
    assert "input 0 stride: [5, 1] there, [1, 9] here" in cache_cli.why(root, count=1)


def test_corrupted_graph_entry_is_rebuilt_with_a_warning(tmp_path, monkeypatch, caplog):
    root = tmp_path / "cache"
    x = torch.randn(3, 33)

    def f(t):
        return (t.exp() - t).sum(-1)

    _compile_in_process(monkeypatch, root, f, x)
    (entry,) = [p for p in (root / "graph").iterdir() if p.is_dir()]
    host = entry / "host.json"
    host.write_text(host.read_text()[: host.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="kiln"):
        _compile_in_process(monkeypatch, root, f, torch.randn(3, 33))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "cached graph" in warnings[0] and "rebuilding" in warnings[0], warnings
    assert cache.check(cache.Entry("graph", entry.name.split("_")[1], entry, {})) is None  # whole again


def test_graph_text_names_every_argument_and_refuses_unnamed_callables():
    gm = torch.fx.symbolic_trace(lambda t: torch.ops.aten.cumsum.default(t, 1))
    assert graph_cache.graph_lines(gm) == ["v0 = input", "v1 = aten::cumsum.default(v0, 1)", "return v1"]

    graph = torch.fx.Graph()
    graph.output(graph.call_function(lambda t: t, (graph.placeholder("t"),)))
    with pytest.raises(graph_cache.Uncacheable, match="no name leads back"):
        graph_cache.graph_lines(torch.fx.GraphModule({}, graph))


def test_explain_says_a_program_came_from_the_graph_cache(tmp_path, monkeypatch):
    import kiln

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))

    def f(t):
        return torch.tanh(t).cumsum(0) / 3

    x = torch.randn(5, 11)
    cold = kiln.explain(f, x)
    torch._dynamo.reset()
    warm = kiln.explain(f, x)
    assert "graph cache" in cold and "miss (not in the cache)" in cold and "build" in cold, cold
    assert "no pass run" in warm and "build" not in warm and "kiln_tanh_0" in warm, warm


def test_program_made_around_a_kiln_error_is_not_stored(tmp_path, monkeypatch):
    """A lowering that raised leaves its op in ATen: the program is right but not kiln's best,
    and a cache entry would keep it after the bug is fixed."""
    from kiln.frontend import importer

    lookup = importer.lookup

    def broken(*args, **kwargs):
        raise RuntimeError("a lowering bug")

    sin = torch.ops.aten.sin.default
    monkeypatch.setattr(importer, "lookup", lambda t: broken if t is sin else lookup(t))
    before = graph_cache.STATS["not cached: kiln raised while compiling"]
    root = tmp_path / "cache"
    _compile_in_process(monkeypatch, root, lambda t: torch.sin(t) * t, torch.randn(4, 6))
    assert graph_cache.STATS["not cached: kiln raised while compiling"] == before + 1
    assert not [p for p in (root / "graph").iterdir() if p.is_dir()]


def test_program_that_does_not_serialize_runs_uncached(tmp_path, monkeypatch):
    from kiln.passes import pipeline

    compile_graph = pipeline.compile_graph

    def with_opaque_constant(*args):
        call, report = compile_graph(*args)
        report.host_program.constants["opaque"] = object()  # as a callable no name resolves would be
        return call, report

    monkeypatch.setattr(pipeline, "compile_graph", with_opaque_constant)
    before = sum(n for reason, n in graph_cache.STATS.items() if "cannot be serialized" in reason)
    root = tmp_path / "cache"
    _compile_in_process(monkeypatch, root, lambda t: torch.relu(t) - 2, torch.randn(7, 3))
    after = sum(n for reason, n in graph_cache.STATS.items() if "cannot be serialized" in reason)
    assert after == before + 1
    assert not [p for p in (root / "graph").iterdir() if p.is_dir()]


def test_constant_tensors_enter_the_text_by_value():
    def text_with(values: torch.Tensor) -> list[str]:
        graph = torch.fx.Graph()
        graph.output(graph.call_function(torch.ops.aten.add.Tensor,
                                         (graph.placeholder("t"), graph.get_attr("weight"))))
        module = torch.nn.Module()
        module.register_buffer("weight", values)
        return graph_cache.graph_lines(torch.fx.GraphModule(module, graph))

    a = text_with(torch.tensor([1.0, 2.0]))
    assert a[1].startswith("v1 = constant tensor torch.float32 [2] stride [1] ")
    assert a != text_with(torch.tensor([1.0, 3.0]))


def test_a_hit_records_what_runs_in_aten_as_the_compile_did(tmp_path, monkeypatch):
    import kiln
    from kiln import errors

    def f(t):
        return torch.softmax(t * 2, -1).cumsum(-1)  # cumsum has no kiln lowering

    root = tmp_path / "cache"
    _compile_in_process(monkeypatch, root, f, torch.randn(4, 8))
    kiln.reset_stats()
    errors.FALLBACKS.clear()
    _compile_in_process(monkeypatch, root, f, torch.randn(4, 8))
    assert len(_graph_events(root, "hit")) == 1
    stats = kiln.stats()
    assert stats.ops_in_aten["aten.cumsum.default"] == 1
    assert (stats.graphs_compiled, stats.graphs_from_cache) == (1, 1)
    assert [(r.scope, r.op) for r in errors.FALLBACKS] == [("op", "aten.cumsum.default")]

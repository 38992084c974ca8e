"""kiln.stats(): counters of what kiln compiled, built, found in its cache and ran in ATen;
and kiln's per-shape compiles shown under TORCH_LOGS=recompiles."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch
from conftest import assert_same

import kiln


def test_counts_graphs_kernels_and_what_ran_in_aten():
    kiln.reset_stats()

    def f(x, n):
        return torch.softmax(x * n, -1).cumsum(-1)  # cumsum has no kiln lowering

    x = torch.randn(4, 8)
    assert_same(kiln.compile(f)(x, 2), f(x, 2))
    s = kiln.stats()
    assert s.graphs_compiled == 1
    assert s.kernels_built + s.kernel_cache_hits >= 1
    assert s.ops_in_aten["aten.cumsum.default"] == 1
    assert not s.graphs_in_aten
    assert "graphs compiled: 1" in str(s)


def test_counts_programs_per_symbolic_graph(monkeypatch):
    monkeypatch.setenv("KILN_SYMBOLIC", "0")  # per shape: one program per shape met
    kiln.reset_stats()

    def f(x):
        return torch.relu(x) + 1

    g = kiln.compile(f, dynamic=True)
    for n in (3, 5, 9, 5):
        x = torch.randn(n)
        assert_same(g(x), f(x))
    assert list(kiln.stats().shape_variants.values()) == [3]


def test_a_graph_run_in_aten_is_counted_with_its_reason():
    kiln.reset_stats()

    def f(x):
        return x * 2

    x = torch.randn(4, dtype=torch.complex64)
    assert_same(kiln.compile(f)(x), f(x))
    reasons = list(kiln.stats().graphs_in_aten)
    assert len(reasons) == 1 and "complex" in reasons[0], reasons


def test_per_shape_compiles_show_under_torch_logs_recompiles(tmp_path):
    script = textwrap.dedent("""
        import torch, kiln
        g = kiln.compile(lambda x: torch.relu(x) + 1, dynamic=True)
        for n in (3, 5):
            g(torch.randn(n))
    """)
    env = {**os.environ, "TORCH_LOGS": "recompiles", "KILN_CACHE_DIR": str(tmp_path), "KILN_SYMBOLIC": "0"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count("kiln: symbolic graph 0 compiled for shapes") == 2, out.stderr[-2000:]
    assert "compiles per shape: KILN_SYMBOLIC=0" in out.stderr, out.stderr[-2000:]

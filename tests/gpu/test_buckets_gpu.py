"""Buckets under mode="reduce-overhead": a shape family's program replays CUDA graphs recorded
at a few padded sizes. Run on a GPU machine:
    PYTHONPATH=src python -m pytest -q tests/gpu/test_buckets_gpu.py -m gpu
"""

import pytest
import torch
from conftest import assert_same

import kiln
from kiln.frontend.backend import REPORTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LENGTHS = (5, 7, 17, 30, 64, 100, 3, 37, 129)  # buckets 8, 32, 64, 128, 4, 256


@pytest.fixture(autouse=True)
def fresh_stats():
    torch._dynamo.reset()
    kiln.reset_stats()


def randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to("cuda")


def test_a_launch_bound_graph_replays_a_few_padded_recordings():
    w = randn(64, 64, seed=1)
    norm = torch.nn.LayerNorm(64).cuda()

    def block(x):  # small: its launches cost more than its work
        h = norm(x)
        return torch.nn.functional.gelu(h @ w) * torch.sigmoid(x) + x.amax(-1, keepdim=True)

    compiled = kiln.compile(block, dynamic=True, mode="reduce-overhead")
    before = len(REPORTS)
    with torch.no_grad():
        for n in LENGTHS + LENGTHS[:3]:  # sizes met again replay their recording
            x = randn(2, n, 64)
            assert_same(compiled(x), block(x))
    s = kiln.stats()
    assert s.graphs_compiled == 1 and s.graphs_symbolic == 1, s
    graphs = REPORTS[before].graphs
    assert graphs.padded, graphs.text()
    assert len(graphs.recordings) == 6, graphs.text()
    assert "CUDA graphs by bucket (sizes padded" in graphs.text()
    assert sum(r.calls for r in graphs.recordings.values()) == len(LENGTHS) + 3


def test_outputs_are_the_callers_own():
    """A later replay of the same recording must not overwrite an output already returned."""
    compiled = kiln.compile(lambda x: torch.relu(x) * 2, dynamic=True, mode="reduce-overhead")
    first_in, second_in = randn(3, 20), randn(3, 21)
    first = compiled(first_in)
    compiled(second_in)
    assert first.shape == (3, 20)
    assert_same(first, torch.relu(first_in) * 2)


def test_a_graph_mixing_positions_records_each_size():
    compiled = kiln.compile(lambda x: torch.var(x, dim=1) * 3, dynamic=True, mode="reduce-overhead")
    before = len(REPORTS)
    for n in (9, 10, 11):
        x = randn(4, n, 32)
        assert_same(compiled(x), torch.var(x, dim=1) * 3)
    graphs = REPORTS[before].graphs
    assert len(graphs.recordings) == 3, graphs.text()
    assert "reduces along a padded dimension" in graphs.text()


def test_reductions_along_the_padded_size_are_masked():
    """Softmax, mean and attention along the sequence: one recording per bucket, each serving
    every length in it, the grown part masked by the real length read at replay."""
    w = randn(64, 64, seed=2) / 8

    def block(x):
        q = (x @ w).view(x.shape[0], x.shape[1], 4, 16).transpose(1, 2)
        attended = torch.nn.functional.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(x.shape)
        return attended + torch.softmax(x, dim=1) * x.mean(1, keepdim=True)

    compiled = kiln.compile(block, dynamic=True, mode="reduce-overhead")
    before = len(REPORTS)
    with torch.no_grad():
        for n in LENGTHS + LENGTHS[:3]:
            x = randn(2, n, 64)
            assert_same(compiled(x), block(x))
    s = kiln.stats()
    assert s.graphs_compiled == 1 and not s.graphs_in_aten, s
    graphs = REPORTS[before].graphs
    assert "masked to the real size" in graphs.text(), graphs.text()
    assert len(graphs.recordings) == 6, graphs.text()

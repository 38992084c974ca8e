"""Buckets through kiln's own compile: a shape family's program run at padded sizes, its
reductions along the padded size masked, equals eager at every size.

CUDA graphs need a GPU (tests/gpu/test_buckets_gpu.py); here the program runs on padded copies
of each call's inputs, which is what a replay at a bucket's size computes.
"""

import pytest
import torch
from conftest import assert_same

import kiln
from kiln.frontend import backend
from kiln.frontend.backend import REPORTS
from kiln.passes import cost
from kiln.runtime import buckets

LENGTHS = (5, 7, 17, 30, 3, 37)  # buckets 8, 32, 4, 64


@pytest.fixture(autouse=True)
def padded_on_this_device(monkeypatch):
    monkeypatch.setattr(backend, "by_buckets", lambda options, device: options.mode == "reduce-overhead")
    monkeypatch.setattr(cost, "launch_bound", lambda report: True)
    grown = buckets.padded_buffer

    def noisy(a, shape):  # the grown part holds values, never a convenient zero
        b = grown(a, shape)
        fill = torch.ones(shape, dtype=torch.bool)
        fill[tuple(slice(0, n) for n in a.shape)] = False
        b[fill] = torch.randn(int(fill.sum())).to(b.dtype) * 100 if b.is_floating_point() else 7
        return b

    monkeypatch.setattr(buckets, "padded_buffer", noisy)
    torch._dynamo.reset()
    kiln.reset_stats()
    yield
    torch._dynamo.reset()


def _attention_block(x, w):
    q = (x @ w).view(x.shape[0], x.shape[1], 4, 16).transpose(1, 2)
    scores = torch.softmax(q @ q.transpose(-1, -2) * 0.25, dim=-1)  # over keys of the padded length
    pooled = x.mean(dim=1, keepdim=True)  # a mean over the padded length
    return (scores @ q).transpose(1, 2).reshape(x.shape) + pooled + x.amax(1, keepdim=True)


def _sdpa(x, w):
    q = (x @ w).view(x.shape[0], x.shape[1], 4, 16).transpose(1, 2)
    keys = torch.nn.functional.scaled_dot_product_attention(q, q, q)  # masked through attn_mask
    causal = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    return keys + causal


@pytest.mark.parametrize("fn", [_attention_block, _sdpa])
def test_masked_reductions_through_kiln_equal_eager(fn):
    w = torch.randn(64, 64) / 8
    compiled = kiln.compile(fn, dynamic=True, mode="reduce-overhead")
    before = len(REPORTS)
    with torch.no_grad():
        for n in LENGTHS:
            x = torch.randn(2, n, 64)
            assert_same(compiled(x, w), fn(x, w))
    s = kiln.stats()
    assert s.graphs_compiled == 1 and s.graphs_symbolic == 1 and not s.graphs_in_aten, s
    graphs = REPORTS[before].graphs
    assert graphs.padded and graphs.plan.masked, graphs.text()
    assert "masked to the real size" in graphs.text()
    assert len(graphs.replays) == len({buckets.bucket(n, 2, None) for n in LENGTHS}), graphs.text()


def _small_model(name: str):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    layers = dict(num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=512)
    if name == "gpt2":
        return transformers.GPT2Model(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=512))
    if name == "bert":  # attention over all positions, masked; a pooler reading the first token
        return transformers.BertModel(transformers.BertConfig(hidden_size=64, **layers))
    return transformers.LlamaModel(transformers.LlamaConfig(hidden_size=64, num_key_value_heads=2, **layers))


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_transformers_models_pad_their_sequence(name):
    """Real models' graphs (a key cache's first concatenation, fused q/k/v split, gathered
    token types, causal and masked attention) pad the sequence: one recording per bucket."""
    torch.manual_seed(0)
    model = _small_model(name).eval()
    compiled = kiln.compile(model, dynamic=True, mode="reduce-overhead")
    before = len(REPORTS)
    with torch.no_grad():
        for n in LENGTHS:
            ids = torch.randint(0, 512, (2, n))
            assert_same(compiled(ids).last_hidden_state, model(ids).last_hidden_state)
    s = kiln.stats()
    assert s.graphs_compiled == 1 and not s.graphs_in_aten, s
    graphs = REPORTS[before].graphs
    assert len(graphs.replays) == len({buckets.bucket(n, 2, None) for n in LENGTHS}), graphs.text()

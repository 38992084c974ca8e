"""Numbers Dynamo passes as 0-d CPU tensors, read by kernels on the GPU. Run on a GPU machine:
    PYTHONPATH=src python -m pytest -q tests/gpu -m gpu
"""

import os

import pytest
import torch
from conftest import assert_same

import kiln
from kiln import errors
from kiln.frontend.backend import REPORTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def graph_fallbacks() -> list:
    return [f for f in errors.FALLBACKS if f.scope == "graph"]


def test_float_argument_on_the_gpu_one_program_for_every_value():
    errors.FALLBACKS.clear()

    def f(x, s):
        return x * s + s

    compiled = kiln.compile(f, dynamic=True)
    x = torch.randn(64, 33, device="cuda")
    before = len(REPORTS)
    for s in (2.5, -0.3, 3.0):
        assert_same(compiled(x, s), f(x, s))
    assert len(REPORTS) == before + 1
    assert not graph_fallbacks(), graph_fallbacks()


def test_transformers_generate_on_the_gpu_with_a_compiled_dynamic_forward():
    transformers = pytest.importorskip("transformers")
    errors.FALLBACKS.clear()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).cuda().eval()
    ids = torch.randint(0, 64, (1, 5), device="cuda")
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=3, do_sample=False)
        model.forward = kiln.compile(model.forward, dynamic=True)
        actual = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert torch.equal(actual, expected), (actual, expected)
    # the numbers reach the kernels: no graph runs in ATen for its inputs' devices or its tracing
    assert not [f for f in graph_fallbacks() if f.kind in ("unsupported", "trace")], graph_fallbacks()

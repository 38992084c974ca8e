"""transformers' generate() on a compiled forward: the prefill and the decode step are each
one program for their shape family, for any prompt length and number of new tokens."""

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_compiles_each_graph_once_for_its_family(cache):
    model = tiny_llama()
    torch._dynamo.reset()
    kiln.reset_stats()
    compiled = torch.compile(model.forward, backend="kiln", dynamic=True)
    options = {"max_new_tokens": 12, "do_sample": False}
    if cache == "static":
        options["cache_implementation"] = "static"
    for length in (5, 9):
        ids = torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(length))
        want = model.generate(ids, **options)
        eager_forward, model.forward = model.forward, compiled
        try:
            got = model.generate(ids, **options)
        finally:
            model.forward = eager_forward
        assert torch.equal(got, want), (got, want)
    s = kiln.stats()
    assert s.graphs_compiled <= 3, s  # the prefill's family and the decode step's
    assert s.graphs_symbolic == s.graphs_compiled and not s.per_shape, s
    assert s.specialized == 0 and not s.graphs_in_aten, s

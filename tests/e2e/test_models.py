"""Whole graphs compiled by kiln against eager: models, and the semantics a user relies on
(in-place updates of inputs, aliasing of outputs, strides, graph breaks, options)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import TOLERANCE, assert_same, check, randomize_batchnorm, run_compiled

import kiln

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BF16_TOL = dict(rtol=5e-2, atol=5e-2)  # a whole block accumulates more bf16 rounding than one op


def _tol(dtype):
    return BF16_TOL if dtype == torch.bfloat16 else TOLERANCE[dtype]


def check_model(model: nn.Module, *inputs, dtype=torch.float32, train=False):
    """model(*inputs) compiled == eager, under no_grad, in eval mode unless train."""
    torch.manual_seed(0)
    model = model.to(dtype).train(train)
    inputs = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        return check(model, *inputs, tol=_tol(dtype))


# -- models -----------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d=32, hidden=64, out=10):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(d, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, out)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.rand(d) + 0.5), eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class SwiGLUBlock(nn.Module):
    def __init__(self, d=64, hidden=128):
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class EncoderBlock(nn.Module):
    """Pre-norm causal self-attention and a GELU MLP, written out by hand."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def test_mlp():
    torch.manual_seed(0)
    check_model(MLP(), torch.randn(16, 32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_swiglu_block(dtype):
    torch.manual_seed(0)
    check_model(SwiGLUBlock(), torch.randn(2, 16, 64), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hand_written_encoder_block(dtype):
    torch.manual_seed(0)
    check_model(EncoderBlock(), torch.randn(2, 16, 64), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transformer_encoder_layer_train_mode(dtype):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
    check_model(layer, torch.randn(2, 16, 64), dtype=dtype, train=True)


def test_conv_net_eval():
    torch.manual_seed(0)
    report = check_model(randomize_batchnorm(ConvNet()), torch.randn(2, 3, 16, 16))
    assert any("convolution" in name for name in report.fallbacks)


def _hf_logits(model):
    def run(ids):
        return model(input_ids=ids).logits

    return run


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpt2(dtype):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).to(dtype).eval()
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        check(_hf_logits(model), ids, tol=_tol(dtype))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama(dtype):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        check(_hf_logits(model), ids, tol=_tol(dtype))


# -- semantics --------------------------------------------------------------------------------


def test_in_place_add_on_input_mutates_caller_tensor():
    def f(x):
        x.add_(1)
        return x * 2

    check(f, torch.randn(4, 8))


def test_in_place_slice_assignment_on_input():
    def f(x, y):
        x[:, 0] = 3
        return x + y

    check(f, torch.randn(4, 8), torch.randn(4, 8))


def test_tensor_constants_in_the_graph():
    def f(x):
        out = x * torch.tensor([1.0, 2.0, 3.0]) + torch.tensor(0.5)
        return out, torch.tensor([[4, 5]])

    check(f, torch.randn(2, 3))


def test_in_place_update_is_visible_to_caller_through_same_object():
    def f(x):
        x.mul_(3)

    x = torch.randn(5, 3)
    expected = x * 3
    run_compiled(f, x)
    torch.testing.assert_close(x, expected)


def test_batch_norm_train_mode_updates_running_stats():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU()).train()
    compiled = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU()).train()
    compiled.load_state_dict(eager.state_dict())
    x = torch.randn(3, 4, 5, 5)
    with torch.no_grad():
        expected = eager(x)
        actual, report = run_compiled(compiled, x)
    assert report is not None
    assert_same(actual, expected)
    for name, buf in eager.named_buffers():
        assert_same(dict(compiled.named_buffers())[name], buf)


def test_outputs_alias_the_input_and_each_other_like_eager():
    def f(x):
        y = x * 2
        return x, x.view(-1), y, y.t()

    x = torch.randn(4, 6)
    out, report = run_compiled(f, x)
    assert report is not None
    assert_same(out, f(x.clone()))
    ox, oxv, oy, oyt = out
    assert ox is x or ox.data_ptr() == x.data_ptr()
    assert oxv.data_ptr() == x.data_ptr() and oxv._base is not None
    assert oyt.data_ptr() == oy.data_ptr()
    assert oyt.stride() == (1, 6)
    oy.add_(1)  # a write through one output shows through the other, as in eager
    torch.testing.assert_close(oyt, oy.t())


def test_output_view_of_input_shares_memory():
    def f(x):
        return x[1:, ::2], x.transpose(0, 1)

    x = torch.randn(6, 8)
    out, report = run_compiled(f, x)
    assert report is not None
    expected = f(x)
    for a, e in zip(out, expected):
        assert_same(a, e)
        assert a.stride() == e.stride()
        assert a.storage_offset() == e.storage_offset()
        assert a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (x + 1).t(),
        lambda x: (x * 2).permute(1, 0).contiguous(),
        lambda x: torch.relu(x)[:, 1:],
        lambda x: x.sum(0, keepdim=True).expand(4, 6),
        lambda x: (x @ x.t()).t(),
    ],
    ids=["transposed", "contiguous", "sliced", "expanded", "mm_transposed"],
)
def test_output_strides_match_eager(fn):
    x = torch.randn(4, 6)
    out, report = run_compiled(fn, x)
    assert report is not None
    expected = fn(x)
    assert_same(out, expected)
    assert out.stride() == expected.stride()


def test_non_tensor_outputs():
    def f(x):
        return x + 1, 3, None, "tag", x.shape[0]

    check(f, torch.randn(2, 3))


def test_graph_break_on_print():
    def f(x):
        y = torch.sin(x) + 1
        print("kiln graph break")
        return torch.cos(y) * 2

    check(f, torch.randn(8, 8))


def test_graph_break_on_item():
    def f(x):
        s = x.sum().item()
        return x * s + 1

    check(f, torch.randn(8, 8))


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="unknown kiln option"):
        kiln.compile(lambda x: x, fullgrpah=True)


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(mode="fastest"), ValueError),
        (dict(target="cuda"), ValueError),
        (dict(fullgraph="yes"), TypeError),
        (dict(dynamic=1.5), TypeError),
    ],
)
def test_bad_option_values_raise_at_the_call(options, error):
    with pytest.raises(error, match="kiln option"):
        kiln.compile(lambda x: x, **options)


def test_compile_rejects_non_callable():
    with pytest.raises(TypeError, match="needs a torch.nn.Module or a function"):
        kiln.compile(42)


def test_torch_compile_backend_name():
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(8, 32)
    from kiln.frontend.backend import REPORTS

    before = len(REPORTS)
    with torch.no_grad():
        compiled = torch.compile(model, backend="kiln")
        assert_same(compiled(x), model(x))
    assert len(REPORTS) > before


def test_kiln_jit_decorator():
    @kiln.jit
    def f(x):
        return torch.tanh(x) * x

    x = torch.randn(16)
    assert_same(f(x), torch.tanh(x) * x)

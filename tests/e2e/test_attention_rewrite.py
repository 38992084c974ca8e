"""Attention written out (matmul, scale, mask, softmax, matmul) runs as one fused attention
call (SDPA), in inference and training; a row with every key masked stays NaN, as eager's."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same, check, run_compiled


def causal_attention(q, k, v):
    t = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


def unmasked_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v


def masked_by_input(q, k, v, mask):
    scores = (q @ k.transpose(-1, -2)) * 0.25
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


def _fused(report) -> bool:
    return any("scaled_dot_product" in op for op in report.fallbacks)


def _verdicts(report, verdict: str) -> list[str]:
    return [d.reason for d in report.decisions if d.verdict == verdict]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [causal_attention, unmasked_attention])
def test_written_out_attention_is_fused(fn, dtype):
    q, k, v = (torch.randn(2, 4, 32, 16, dtype=dtype) for _ in range(3))
    report = check(fn, q, k, v)
    assert _fused(report)
    assert len(_verdicts(report, "sdpa")) == 1


def test_a_constant_causal_mask_becomes_is_causal():
    q, k, v = (torch.randn(2, 4, 32, 16) for _ in range(3))
    assert "causal" in _verdicts(check(causal_attention, q, k, v), "sdpa")[0]


def test_a_boolean_mask_from_an_input_is_fused_and_a_fully_masked_row_stays_nan():
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    mask = torch.rand(8, 8) > 0.5
    mask[3] = True  # every key masked: NaN, as in eager
    report = check(masked_by_input, q, k, v, mask)
    assert _fused(report) and "boolean mask" in _verdicts(report, "sdpa")[0]


def test_unscaled_attention_keeps_scale_one():
    """No scale written means scale 1, not SDPA's default 1/sqrt(d), in both rewrites."""
    def f(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v

    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    assert _fused(check(f, q, k, v))
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.frontend.attention import rewrite_attention
    from kiln.frontend.decompositions import decomposition_table

    gm = make_fx(f, decomposition_table(), tracing_mode="fake")(q, k, v)
    assert rewrite_attention(gm) == 1
    torch.testing.assert_close(gm(q, k, v), f(q, k, v))


class NanoAttention(torch.nn.Module):
    """nanoGPT's written-out causal attention: a tril buffer, dropout, softmax."""

    def __init__(self, t: int, dropout: float = 0.0):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, q, k, v):
        t = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        return self.drop(F.softmax(att, dim=-1)) @ v


def additive_mask_attention(q, k, v, mask):
    """transformers' eager attention: a float mask added, softmax in float32, cast back."""
    w = torch.matmul(q, k.transpose(2, 3)) * 0.125 + mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(F.dropout(w, p=0.0, training=True), v)


def _train_and_compare(fn, *args):
    """Forward and gradients of fn compiled equal eager's; returns the forward's report.
    Gradients are compared by value: SDPA's backward returns them in its own layout (a
    parameter's .grad still takes the parameter's, by autograd's layout contract)."""
    leaves = [a.clone().requires_grad_(i < 3) for i, a in enumerate(args)]  # q, k, v
    expected = fn(*leaves)
    expected_grads = torch.autograd.grad(expected.sum(), [a for a in leaves if a.requires_grad])
    kiln_leaves = [a.detach().clone().requires_grad_(a.requires_grad) for a in leaves]
    actual, report = run_compiled(fn, *kiln_leaves)
    grads = torch.autograd.grad(actual.sum(), [a for a in kiln_leaves if a.requires_grad])
    assert_same(actual, expected)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    return report


def _saves_probabilities(report, q_shape) -> bool:
    t = q_shape[-2]
    return any(shape.endswith(f"{t}, {t}]") and f"[{q_shape[0]}, {q_shape[1]}" in shape
               for _, shape in report.partition.saved)


def test_training_attention_saves_no_probabilities():
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    report = _train_and_compare(NanoAttention(16).train(), q, k, v)
    assert _verdicts(report, "sdpa") and not _saves_probabilities(report, q.shape)


def test_training_attention_with_an_additive_mask():
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    mask = torch.randn(2, 1, 1, 16)
    report = _train_and_compare(additive_mask_attention, q, k, v, mask)
    assert "float mask" in _verdicts(report, "sdpa")[0]
    assert not _saves_probabilities(report, q.shape)


def test_dropout_that_drops_keeps_the_written_out_form_and_says_why():
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    _, report = run_compiled(NanoAttention(16, dropout=0.5).train(), q, k, v)
    assert not _verdicts(report, "sdpa")
    assert "random stream" in _verdicts(report, "kept")[0]


def test_probabilities_read_elsewhere_keep_the_written_out_form():
    def f(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1)
        return p @ v, p

    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    report = check(f, q, k, v)
    assert "read elsewhere" in _verdicts(report, "kept")[0]


def test_softmax_over_another_dim_is_not_attention():
    def f(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-2) @ v

    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    assert not _fused(check(f, q, k, v))

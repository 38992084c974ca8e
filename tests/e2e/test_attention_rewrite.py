"""Attention written out (matmul, scale, causal mask, softmax, matmul) runs as one fused
attention call; other masks keep the written-out form (their fully masked rows are NaN)."""

import pytest
import torch
from conftest import check


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
    return "aten.scaled_dot_product_attention.default" in report.fallbacks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [causal_attention, unmasked_attention])
def test_written_out_attention_is_fused(fn, dtype):
    q, k, v = (torch.randn(2, 4, 32, 16, dtype=dtype) for _ in range(3))
    report = check(fn, q, k, v)
    assert _fused(report)
    assert report.passes[0].name == "attention" and report.passes[0].summary.startswith("1 ")


def test_a_mask_from_an_input_keeps_the_written_out_form():
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    mask = torch.rand(8, 8) > 0.5
    mask[3] = True  # a fully masked row: NaN, as in eager
    report = check(masked_by_input, q, k, v, mask)
    assert not _fused(report)


def test_softmax_over_another_dim_is_not_attention():
    def f(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-2) @ v

    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    assert not _fused(check(f, q, k, v))

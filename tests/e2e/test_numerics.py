"""Generated code rounds as eager does: each op's result is rounded to its dtype before the
next op reads it, so values that cancel in eager cancel exactly in kiln too."""

import torch
import torch.nn.functional as F

from conftest import run_compiled


def test_a_product_minus_its_own_mean_over_one_element_is_zero():
    """No multiply-add contraction: a*b - mean(a*b) over rows of one is exactly 0, not the
    product's rounding error."""
    def f(a, b):
        v = a * b
        return v - v.mean(-1, keepdim=True)

    a, b = torch.randn(256, 1), torch.randn(256, 1)
    out, _ = run_compiled(f, a, b)
    assert torch.equal(out, f(a, b)), (out - f(a, b)).abs().max()


def test_layer_norm_over_one_element_with_a_tiny_eps_is_its_bias():
    """x - mean is exactly 0 over a size-1 dim, so the result is the bias, even though
    eps=1e-12 magnifies any rounding error by 1e6."""
    def f(a, b, w, c):
        return F.layer_norm(a * b, (1,), w, c, eps=1e-12)

    a, b, w, c = torch.randn(256, 1), torch.randn(256, 1), torch.randn(1), torch.randn(1)
    out, _ = run_compiled(f, a, b, w, c)
    torch.testing.assert_close(out, f(a, b, w, c), rtol=1e-6, atol=1e-6)

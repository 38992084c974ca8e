"""Values every correct compiler computes exactly like eager: rows of equal values centre to
exactly 0 (normalizations would amplify a one-ulp mean into a visible error), and the sign of
a zero survives rounding, remainders, -0.0 literals and training graphs."""

import pytest
import torch
import torch.nn.functional as F
from conftest import run_compiled


def _constant_rows(rows: int, width: int) -> torch.Tensor:
    """Each row holds one random value (not a power of two: its sum is rounded)."""
    return (torch.rand(rows, 1) + 0.5).expand(rows, width).contiguous()


CENTERED = {
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "layer_norm_2d": lambda x: F.layer_norm(x.view(16, 4, -1), x.view(16, 4, -1).shape[-2:]),
    "group_norm": lambda x: F.group_norm(x.view(16, 4, -1), 2),
    "var": lambda x: x.var(-1),
    "std": lambda x: x.std(-1, keepdim=True),
    "var_mean": lambda x: torch.var_mean(x, -1, correction=0)[0],
}


@pytest.mark.parametrize("width", [256, 100])
@pytest.mark.parametrize("name", sorted(CENTERED))
def test_rows_of_equal_values_centre_to_exactly_zero(name, width):
    fn = CENTERED[name]
    x = _constant_rows(16, width)
    out, report = run_compiled(fn, x)
    assert report is not None
    expected = fn(x)
    assert torch.equal(expected, torch.zeros_like(expected))
    assert torch.equal(out, expected), (out - expected).abs().max()



def _random_signs(n: int) -> torch.Tensor:
    return torch.where(torch.rand(n) < 0.5, -1.0, 1.0)


def _zeros_of_both_signs(n: int) -> torch.Tensor:
    return torch.zeros(n) * _random_signs(n)


# name -> (function, input makers); every output holds zeros whose sign eager fixes.
# Not torch.maximum/minimum: on ties eager returns the first operand in its scalar loop and the
# second in its vector loop (relu and clamp keep x in both).
SIGNED_ZEROS = {
    "round": (torch.round, [lambda n: (torch.rand(n) * 0.49 + 0.01) * _random_signs(n)]),
    "round_half": (torch.round, [lambda n: 0.5 * _random_signs(n)]),
    "trunc": (torch.trunc, [lambda n: (torch.rand(n) * 0.99 + 0.01) * _random_signs(n)]),
    "ceil": (torch.ceil, [lambda n: -(torch.rand(n) * 0.99 + 0.01)]),
    "remainder_self": (lambda x: torch.remainder(x, x), [lambda n: (torch.rand(n) + 0.5) * _random_signs(n)]),
    "remainder": (torch.remainder, [lambda n: torch.randint(1, 4, (n,)) * 2.0 * _random_signs(n),
                                    lambda n: 2.0 * _random_signs(n)]),
    "fmod": (torch.fmod, [lambda n: torch.randint(1, 4, (n,)) * 2.0 * _random_signs(n),
                          lambda n: 2.0 * _random_signs(n)]),
    "floor_divide": (torch.floor_divide,
                     [_zeros_of_both_signs, lambda n: (torch.rand(n) + 0.5) * _random_signs(n)]),
    "neg": (torch.neg, [_zeros_of_both_signs]),
    # frac(-0.0) and frac(-3.0) are 0.0 (not -0.0, as floor(|x|) * sign(x) would give)
    "frac": (torch.frac, [lambda n: torch.randint(-3, 3, (n,)) * 1.0 * _random_signs(n)]),
    "copysign_int": (lambda x: torch.copysign(x, -0.0),
                     [lambda n: torch.randint(-9, 9, (n,), dtype=torch.int32)]),
    "copysign": (lambda x: torch.copysign(x, -0.0), [lambda n: torch.randn(n)]),
    "copysign_ints": (torch.copysign, [lambda n: torch.randint(-2, 3, (n,)),
                                       lambda n: torch.randint(-9, 9, (n,), dtype=torch.int32)]),
    "mul_negative_zero": (lambda x: x * -0.0, [lambda n: torch.randn(n)]),
    "where_negative_zero": (lambda x: torch.where(x > 0, x, -0.0), [lambda n: torch.randn(n)]),
    "masked_fill": (lambda x: x.masked_fill(x < 0, -0.0), [lambda n: torch.randn(n)]),
    "relu": (torch.relu, [_zeros_of_both_signs]),
    "clamp_ties": (lambda x: torch.clamp(x, min=-0.0, max=0.0), [_zeros_of_both_signs]),
    # an integer has no -0: the small negative fractions become 0, and 0 / negative is -0.0
    "through_int": (lambda x: torch.div(torch.frac(x).to(torch.int64), x, rounding_mode="trunc"),
                    [lambda n: -(torch.rand(n) + 1.1)]),
    "through_int_float": (lambda x: torch.frac(x).to(torch.int32).to(torch.float32) * -1.0,
                          [lambda n: -(torch.rand(n) + 1.1)]),
}


@pytest.mark.parametrize("n", [5, 67])
@pytest.mark.parametrize("name", sorted(SIGNED_ZEROS))
def test_zeros_keep_eager_sign(name, n):
    fn, makers = SIGNED_ZEROS[name]
    args = [make(n) for make in makers]
    out, report = run_compiled(fn, *args)
    assert report is not None
    expected = fn(*args)
    assert torch.equal(out, expected), (out, expected)
    assert torch.equal(torch.signbit(out), torch.signbit(expected)), (out, expected)


def test_a_training_graph_keeps_distinct_signed_zero_fills():
    """masked_fill(-0.0) and masked_fill(0.0) decompose to scalar_tensor(-0.0) and (0.0): the
    training split must not merge them into one constant."""
    def f(x, first, second):
        return x.masked_fill(first, -0.0).masked_fill(second, 0.0) * 2.0

    x = torch.randn(6, requires_grad=True)
    first, second = torch.rand(6) < 0.5, torch.rand(6) < 0.5
    first[:2], second[:2] = True, torch.tensor([True, False])
    out, report = run_compiled(f, x, first, second)
    assert report is not None
    expected = f(x, first, second)
    assert torch.equal(torch.signbit(out), torch.signbit(expected)), (out, expected)
    assert torch.equal(out, expected)
    grad = torch.randn(6)
    assert torch.equal(torch.autograd.grad(out, x, grad)[0], torch.autograd.grad(expected, x, grad)[0])

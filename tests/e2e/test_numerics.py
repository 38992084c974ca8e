"""Generated code computes what eager computes: each op's result is rounded to its dtype
before the next op reads it (values that cancel in eager cancel in kiln too), long sums are
summed in blocks, and scalar arguments keep eager's dtype rules."""

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import check, run_compiled

INTERPRETED = os.environ.get("KILN_TARGET") == "triton"


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


def _relative_error(value: torch.Tensor, exact: torch.Tensor) -> float:
    return ((value.double() - exact) / exact).abs().max().item()


def test_long_column_sums_mean_and_var_are_summed_in_blocks():
    """A sum over hundreds of thousands of rows is as close to the exact value as eager's (blocks of
    partial sums), not a running sum's error that grows with the length."""
    def f(x):
        return x.sum(0), x.mean(0), x.var(0), x.view(-1).sum()

    rows = 70_001 if INTERPRETED else 300_007  # the interpreter takes seconds per 100,000 rows
    torch.manual_seed(0)  # the bound lies a few ulps from eager's own error: one fixed draw
    x = torch.rand(rows, 3) + 0.5  # positive terms: a running sum's error does not cancel
    out, _ = run_compiled(f, x)
    exact = (x.double().sum(0), x.double().mean(0), x.double().var(0), x.double().sum())
    for value, expected, reference in zip(out, exact, f(x)):
        assert value.dtype == reference.dtype
        assert _relative_error(value, expected) <= max(4 * _relative_error(reference, expected), 2.5e-7)


@pytest.mark.skipif(INTERPRETED, reason="2**31 terms take minutes in the interpreter")
def test_a_sum_of_more_than_2_to_the_31_terms_neither_stalls_nor_overflows():
    """2**31 + 3 twos: a float32 running sum stops growing at 2**25 (2**25 + 2 rounds back),
    an int32 count would wrap. The input is an expanded view: nothing is materialized."""
    n = 2**31 + 3
    x = torch.ones(1).expand(n)
    (total, mean), _ = run_compiled(lambda x: ((x * 2).sum(), (x * 2).mean()), x)
    assert total.item() == torch.tensor(2.0 * n, dtype=torch.float32).item()
    assert mean.item() == 2.0


def _ints(dtype: torch.dtype, n: int = 64) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.rand(n) < 0.5
    low, high = (0, 250) if dtype is torch.uint8 else (-100, 100)
    return torch.randint(low, high, (n,), dtype=dtype)


@pytest.mark.parametrize("alpha", [-1, 0, 2, True, False])
def test_bool_add_with_alpha_converts_alpha_to_bool_first(alpha):
    """Eager computes a + bool(alpha) * b on bool tensors: alpha=-1 is True, not a subtraction."""
    check(lambda a, b: (torch.add(a, b, alpha=alpha), torch.add(a, a, alpha=alpha)), _ints(torch.bool),
          _ints(torch.bool), expect_native=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_alpha_and_value_scalars_wrap_as_in_eager(dtype):
    def f(a, b, c, m):
        return (torch.add(a, b, alpha=3), torch.sub(a, b, alpha=-7), torch.rsub(a, b, alpha=2),
                torch.addcmul(a, b, c, value=3), a * -1, a - 3, torch.add(a, m, alpha=-1), m + 2)

    check(f, _ints(dtype), _ints(dtype), _ints(dtype), _ints(torch.bool), expect_native=True)


@pytest.mark.parametrize("value", [0.5, 2.7, -1.5])
def test_integer_addcmul_with_a_float_value_compiles_and_truncates_it(value):
    """Eager converts value to the integer type (0.5 -> 0); PyTorch's decomposition raises."""
    check(lambda a, b, c: torch.addcmul(a, b, c, value=value) * 2, _ints(torch.int64), _ints(torch.int64),
          _ints(torch.int64), expect_native=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["prod", "sum"])
def test_a_low_precision_sum_or_product_is_rounded_before_it_is_read(kind, dtype):
    """prod(bf16).float(): eager rounds the product to bf16 before the cast. Rows are short
    enough that float32 sums and products of them are exact, so the results are equal."""
    def f(x, y):
        r = x.prod(-1) if kind == "prod" else x.sum(-1)
        return r.float() * 3 + y

    x, y = torch.randn(64, 2).to(dtype), torch.randn(64)
    out, _ = run_compiled(f, x, y)
    assert torch.equal(out, f(x, y)), (out - f(x, y)).abs().max()


@pytest.mark.parametrize("n", [5, 21, 37])
def test_a_value_compared_with_its_own_maximum_has_a_winner_in_every_row(n):
    """erf(x) == amax(erf(x)): the value is computed once and read by both, so each row has a
    winner (a vector loop and a scalar tail may round a library function differently)."""
    def f(x):
        v = torch.erf(x * 0.5)
        return v == v.amax(-1, keepdim=True)

    x = torch.randn(16, n)
    out, _ = run_compiled(f, x)
    assert torch.equal(out, f(x))


def test_rounding_to_bf16_matches_eager_bit_for_bit_over_float32_bit_patterns():
    """Ties to even, overflow to infinity, subnormals kept, NaN stays NaN: a million float32
    bit patterns spread over the whole range, rounded to bf16 inside a kernel and read back."""
    bits = torch.arange(-2**31, 2**31, 4099, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)

    def f(x):
        return (x.to(torch.bfloat16) * 1).float() + 0

    out, _ = run_compiled(f, x)
    expected = f(x)
    same = (out.view(torch.int32) == expected.view(torch.int32)) | (out.isnan() & expected.isnan())
    assert bool(same.all()), x[~same][:8]

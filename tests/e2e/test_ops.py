"""Element-wise ops, compiled vs eager: arithmetic, comparisons, math functions,
activations, casts and type promotion, integer semantics, layouts and NaN/inf."""

import pytest
import torch
import torch.nn.functional as F
from conftest import check
from op_inputs import FLOATS, LAYOUTS, nonzero_ints, positive, randint, randn, with_layout, with_specials


# ----------------------------------------------------------------------------- arithmetic
@pytest.mark.parametrize("dtype", FLOATS)
def test_arithmetic(dtype):
    def f(x, y):
        return (x + y, x - y, x * y, x / y, torch.add(x, y, alpha=2), torch.sub(x, y, alpha=0.5),
                x + 1.5, 2 - x, x * 3, x / 7, 1 / y, -x, torch.rsub(x, 2.0))

    check(f, randn(8, 33, dtype=dtype), randn(8, 33, dtype=dtype, seed=1), expect_native=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_arithmetic(dtype):
    def f(x, y):
        return x + y, x - y, x * y, x + 3, x * -2, torch.add(x, y, alpha=3), x / y, x * 1.5

    check(f, randint(-50, 50, 6, 17, dtype=dtype), nonzero_ints(6, 17, dtype=dtype, seed=1),
          expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_div_rounding_mode_float(dtype, mode):
    def f(x, y):
        return torch.div(x, y, rounding_mode=mode), torch.div(x, 0.3, rounding_mode=mode)

    check(f, randn(7, 19, dtype=dtype) * 4, randn(7, 19, dtype=dtype, seed=1), expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_round_to_decimals(dtype):
    def f(x):
        return tuple(torch.round(x, decimals=d) for d in (2, 1, -1, -2)) + (torch.square(x),)

    check(f, randn(9, 31, dtype=dtype) * 300, expect_native=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_division_and_remainder_negative_operands(dtype):
    def f(x, y):
        return (torch.div(x, y, rounding_mode="floor"), torch.div(x, y, rounding_mode="trunc"),
                x // y, x % y, torch.remainder(x, y), torch.fmod(x, y), x // 4, x % -3,
                torch.fmod(x, 3))

    check(f, randint(-40, 40, 5, 23, dtype=dtype), nonzero_ints(5, 23, dtype=dtype, seed=2),
          expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_floor_divide_remainder_fmod(dtype):
    def f(x, y):
        return x // y, x % y, torch.remainder(x, -1.5), torch.fmod(x, y), torch.fmod(x, 0.7)

    check(f, randn(6, 21, dtype=dtype) * 5, randn(6, 21, dtype=dtype, seed=3), expect_native=True)


# ----------------------------------------------------------------------------- comparisons, logic
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_comparisons(dtype):
    def f(x, y):
        return (x == y, x != y, x < y, x <= y, x > y, x >= y, x > 0, x <= 1, x == 0.5,
                torch.eq(x, x), torch.ne(x, 2))

    x = randint(-3, 3, 9, 14, dtype=dtype)
    y = randint(-3, 3, 9, 14, dtype=dtype, seed=1)
    check(f, x, y, expect_native=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_comparison_with_inexact_scalar(dtype):
    """The scalar is converted to the tensor's dtype before comparing, as in eager."""

    def f(x):
        return x > 0.1, x >= 0.1, x == 0.1, x < 0.3, torch.maximum(x, torch.tensor(0.1, dtype=x.dtype))

    x = torch.tensor([0.1, 0.3, 0.2, -0.1, 0.10009765625, 0.30078125], dtype=dtype)
    check(f, x, expect_native=True)


def test_bf16_scalar_operands_exact():
    """Eager rounds a scalar to bf16 for most ops, but multiplies and divides by it unrounded."""

    def f(x, y, s):
        return (x * 0.7, x / 0.7, x + 0.7, x - 0.7, torch.fmod(x, 0.7), torch.remainder(x, 0.7),
                torch.div(x, 0.7, rounding_mode="floor"), torch.div(x, 0.7, rounding_mode="trunc"),
                torch.div(x, y, rounding_mode="trunc"), torch.clamp(x, 0.7), x * s, x / s, x + s)

    x = randn(16, 64, dtype=torch.bfloat16) * 5
    y = randn(16, 64, dtype=torch.bfloat16, seed=1)
    check(f, x, y, torch.tensor(0.7, dtype=torch.float64), tol=dict(rtol=0, atol=0), expect_native=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_chains_round_like_eager(dtype):
    """Each op's result is rounded to the dtype, so comparisons, floors and int casts agree."""

    def f(x, y):
        return (torch.floor(x * y), x + y == x, x * 1.01 > x, (x * y * 10).to(torch.int64), (x * y) // 0.5,
                torch.add(x, y, alpha=0.3), torch.sub(x, y, alpha=3), (x - y).round(), (x * y).isinf())

    x = randn(64, 64, dtype=dtype) * 4
    x[0, :4] = torch.tensor([60000.0, -60000.0, 300.0, 3.0e4]).to(dtype)
    y = randn(64, 64, dtype=dtype, seed=1)
    y[0, :4] = 2.0
    check(f, x, y, tol=dict(rtol=0, atol=0), expect_native=True)


def test_logical_ops():
    def f(a, b, x):
        return (a & b, a | b, a ^ b, ~a, torch.logical_and(a, x), torch.logical_or(x, b),
                torch.logical_xor(a, x), torch.logical_not(x), torch.logical_not(a))

    a = randint(0, 2, 7, 11, seed=1).bool()
    b = randint(0, 2, 7, 11, seed=2).bool()
    x = randint(-2, 3, 7, 11, seed=3).float()
    check(f, a, b, x, expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_where(dtype):
    def f(c, x, y):
        return torch.where(c, x, y), torch.where(c, x, 0.25), torch.where(x > 0, 1.0, y), torch.where(c, 2, 3)

    c = randint(0, 2, 5, 12).bool()
    check(f, c, randn(5, 12, dtype=dtype), randn(1, 12, dtype=dtype, seed=1), expect_native=True)


# ----------------------------------------------------------------------------- casts, promotion
def test_casts():
    def f(x, i, b):
        return (x.to(torch.int64), x.to(torch.int32), x.to(torch.bool), x.to(torch.bfloat16),
                x.to(torch.float64), i.to(torch.float32), i.to(torch.bool), i.to(torch.bfloat16),
                b.to(torch.float32), b.to(torch.int64), x.to(torch.bfloat16).to(torch.float32),
                x.double().to(torch.bfloat16), i.to(torch.int32))

    x = randn(6, 13) * 10
    x[0, :4] = torch.tensor([0.0, -0.0, 2.5, -2.5])
    check(f, x, randint(-100, 100, 6, 13), randint(0, 2, 6, 13).bool(), expect_native=True)


def test_conversion_naming_its_own_device_is_native():
    # autocast writes dtype conversions as _to_copy(x, dtype=..., device=<x's device>)
    def f(x):
        return x.to(device=x.device, dtype=torch.bfloat16) * 2, torch.ones(3, device=x.device) + x[0, :3]

    check(f, randn(4, 5), expect_native=True)


def test_type_promotion():
    def f(xf, xi, xb, xd, xh, s0, si0):
        return (xi + xf, xi * 2.5, xb + xi, xb * xf, xf + xd, xh + xf, xh + 1, xh * 2.5,
                xi + s0, xh + s0, s0 + si0, xf + si0, xi / 2, xi > 1.5, xb & (xi > 0), xb + xb)

    xf = randn(4, 9)
    xi = randint(-5, 5, 4, 9, dtype=torch.int32)
    xb = randint(0, 2, 4, 9).bool()
    xd = randn(4, 9, dtype=torch.float64, seed=2)
    xh = randn(4, 9, dtype=torch.bfloat16, seed=3)
    s0 = torch.tensor(1.25, dtype=torch.float64)  # 0-d: does not promote dimensioned floats
    si0 = torch.tensor(3)
    check(f, xf, xi, xb, xd, xh, s0, si0, expect_native=True)


def test_zero_dim_tensors():
    def f(a, b, x):
        return a + b, a * x, torch.exp(a), (a > b), torch.where(a > 0, a, b), x - a

    check(f, torch.tensor(1.5), torch.tensor(-0.5), randn(3, 4), expect_native=True)


# ----------------------------------------------------------------------------- math functions
UNARY_FNS = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "expm1": torch.expm1, "sin": torch.sin,
    "cos": torch.cos, "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "sign": torch.sign, "square": torch.square, "reciprocal": torch.reciprocal,
}
POSITIVE_FNS = {"log": torch.log, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
                "log2": torch.log2}


@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_math(dtype):
    def f(x, p):
        return tuple(fn(x) for fn in UNARY_FNS.values()) + tuple(fn(p) for fn in POSITIVE_FNS.values())

    x = randn(8, 37, dtype=dtype) * 3
    x[0, :6] = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.0])  # round half to even
    check(f, x, positive(8, 37, dtype=dtype, seed=1), expect_native=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_unary_on_integers(dtype):
    def f(x):
        return (torch.abs(x), -x, torch.sign(x), torch.floor(x), torch.round(x), torch.exp(x),
                torch.sqrt(x.abs()), torch.sigmoid(x), torch.isnan(x), torch.isinf(x))

    check(f, randint(-6, 7, 5, 8, dtype=dtype), expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_pow(dtype):
    def f(x, p, e):
        return (x ** 2, x ** 3, p ** 0.5, p ** -1.5, p ** 2.3, x ** 0, x ** 1, torch.pow(p, e),
                torch.pow(2.0, x), p ** e.abs())

    check(f, randn(6, 15, dtype=dtype), positive(6, 15, dtype=dtype, seed=1),
          randn(6, 15, dtype=dtype, seed=2), expect_native=True)


def test_integer_pow():
    def f(x, e):
        return x ** 2, x ** 3, torch.pow(x, e), x ** 0.5, torch.pow(2, e)

    check(f, randint(-5, 6, 4, 9), randint(0, 5, 4, 9, seed=1), expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_activations(dtype):
    def f(x):
        return (torch.relu(x), F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x), F.softplus(x),
                F.softplus(x, beta=2.0, threshold=1.0), torch.sigmoid(x), torch.tanh(x),
                F.leaky_relu(x, 0.1), F.hardtanh(x), F.elu(x))

    x = randn(8, 40, dtype=dtype) * 4
    check(f, x, expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_clamp(dtype):
    def f(x, lo, hi):
        return (torch.clamp(x, -0.5, 0.5), torch.clamp(x, min=0), torch.clamp(x, max=1),
                torch.clamp(x, lo, hi), torch.clamp(x, min=lo), torch.clamp(x, max=hi),
                torch.clamp_min(x, 0.25), torch.clamp_max(x, -0.25), torch.clamp(x, 1, -1))

    lo = randn(6, 17, dtype=dtype, seed=1) - 1
    hi = randn(1, 17, dtype=dtype, seed=2) + 1
    check(f, randn(6, 17, dtype=dtype), lo, hi, expect_native=True)


def test_clamp_integers():
    def f(x, lo, hi):
        return (torch.clamp(x, -2, 3), torch.clamp(x, lo, hi), torch.clamp(x, min=lo), torch.clamp(x, max=1),
                torch.clamp(x, min=0.5))

    check(f, randint(-5, 5, 6, 17), randint(-4, 0, 6, 17), randint(0, 4, 1, 17), expect_native=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_bitwise(dtype):
    def f(x, y):
        out = (x & y, x | y, x ^ y, ~x, torch.bitwise_and(x, True if dtype is torch.bool else 6))
        if dtype is not torch.bool:
            out += (x << 2, x >> 1, y << x.abs() % 5, torch.bitwise_or(x, 3))
        return out

    hi = 2 if dtype is torch.bool else 100
    lo = 0 if dtype is torch.bool else -100
    check(f, randint(lo, hi, 5, 13, dtype=dtype), randint(lo, hi, 5, 13, dtype=dtype, seed=1),
          expect_native=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_shifts_by_large_and_negative_amounts(dtype):
    """Shifting by the bit width or more gives 0 (left) or the sign (right), as in eager."""

    def f(x, s):
        return x << s, x >> s, x << 3, x >> 2

    lo = 0 if dtype is torch.uint8 else -100
    x = randint(lo, 100, 4, 20, dtype=dtype)
    s = randint(0, 2 * torch.iinfo(dtype).bits, 4, 20, dtype=dtype, seed=1)
    check(f, x, s, expect_native=True)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_small_integer_wraparound(dtype):
    def f(x, y):
        return x + y, x * y, x - y, x * 3 + 100, -x, x // 7, x % 5, x.abs(), torch.maximum(x, y)

    lo = 0 if dtype is torch.uint8 else -100
    check(f, randint(lo, 100, 5, 11, dtype=dtype), randint(lo, 100, 5, 11, dtype=dtype, seed=1) | 1,
          expect_native=True)


# ----------------------------------------------------------------------------- NaN / inf
@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_inf_propagation(dtype):
    def f(x, y):
        return (torch.maximum(x, y), torch.minimum(x, y), torch.clamp(x, -1, 1), torch.relu(x),
                torch.isnan(x), torch.isinf(x), torch.isfinite(x), x * 0, torch.sign(x), torch.abs(x),
                torch.clamp(x, min=y), torch.exp(x), torch.sigmoid(x), torch.where(torch.isnan(x), 0.0, x),
                torch.nan_to_num(x), F.gelu(torch.nan_to_num(x, posinf=0.0, neginf=0.0, nan=float("nan"))),
                F.silu(x), torch.floor(x))

    # gelu is fed no infinities: eager's vectorized gelu(inf) is NaN, its scalar path inf
    x = with_specials(randn(8, 32, dtype=dtype))
    y = with_specials(randn(8, 32, dtype=dtype, seed=1), seed=1)
    check(f, x, y, expect_native=True)


# ----------------------------------------------------------------------------- layouts, shapes
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layouts(layout, dtype):
    def f(x, y):
        return x * y + 1, torch.exp(x) - y, (x > y).to(x.dtype)

    x = with_layout(randn(12, 20, dtype=dtype), layout)
    y = with_layout(randn(12, 20, dtype=dtype, seed=1), "transposed")
    check(f, x, y, expect_native=True)


def test_views_inside_graph():
    def f(x):
        return x.t() * 2, x[:, ::2] + x[:, 1::2], x[1:] - x[:-1], x[2:5, 3:9].exp(), x.flip(0) + 0

    check(f, randn(10, 16), expect_native=False)


def test_broadcasting():
    def f(a, b, c, d):
        return a + b, a * b - c, torch.maximum(a, d), b.expand(7, 9) + 1, a.expand(7, 9) * d

    a = randn(1, 9)
    b = randn(7, 1, seed=1)
    c = randn(9, seed=2)
    d = randn(7, 9, seed=3)
    check(f, a, b, c, d, expect_native=True)


def test_broadcast_3d_and_expanded_input():
    def f(a, b):
        return a * b, (a - b).sum(1)

    a = randn(4, 1, 6)
    b = randn(5, 1, seed=1).expand(5, 6)  # stride 0 input
    check(f, a, b, expect_native=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_large_tensors_take_the_parallel_path(dtype):
    def f(x, y):
        return x * y + 3, torch.maximum(x, y), x // 3, x.t() - y, torch.sigmoid(x)

    if dtype.is_floating_point:
        x, y = randn(301, 301, dtype=dtype) * 10, randn(301, 301, dtype=dtype, seed=1)
    else:
        x, y = randint(-99, 99, 301, 301), randint(-99, 99, 301, 301, seed=1)
    check(f, x, y, expect_native=True)


def test_mixed_promotion_in_where_and_masked_fill():
    def f(c, i, x, s):
        return (torch.where(c, i, 0.5), torch.where(c, i, x), x.masked_fill(c, s), i.masked_fill(c, -1),
                i // -3, i // 2.5, i % 2.5, torch.where(c, x, s))

    c = randint(0, 2, 5, 8).bool()
    check(f, c, randint(-20, 20, 5, 8, seed=1), randn(5, 8, dtype=torch.bfloat16), torch.tensor(0.3),
          expect_native=True)


def test_empty_tensors():
    def f(x, y):
        return x + 1, x * y, torch.exp(x), x > 0

    check(f, randn(0, 7), randn(1, 7), expect_native=True)


def test_in_place_updates():
    def f(x, y):
        x.mul_(2).add_(y)
        y.clamp_(min=0)
        return x.sum()

    check(f, randn(6, 10), randn(6, 10, seed=1))

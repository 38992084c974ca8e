"""Reductions, softmax and normalizations, compiled vs eager, over the last, first,
several and all dimensions, with NaN/inf where eager defines what they do."""

import pytest
import torch
import torch.nn.functional as F
from conftest import TOLERANCE, check
from op_inputs import FLOATS, randint, randn, with_layout, with_specials

DIMS = [-1, 0, (0, 2), None]


def _dims_kw(dim):
    return {} if dim is None else {"dim": dim}


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_sum_mean_prod_amax_amin(dtype, dim):
    def f(x):
        kw = _dims_kw(dim)
        out = (x.sum(**kw), x.mean(**kw), x.amax(**kw), x.amin(**kw))
        if kw:
            out += (x.sum(**kw, keepdim=True), x.amax(**kw, keepdim=True), x.mean(**kw, keepdim=True))
        if not isinstance(dim, tuple):  # prod takes one dim
            out += (x.prod(**kw),)
        return out

    x = randn(6, 5, 24, dtype=dtype)
    x = x.abs() + 0.5 if dtype is torch.bfloat16 else x  # keep prod well conditioned
    tol = dict(rtol=2e-2, atol=5e-2) if dtype is torch.bfloat16 else None
    check(f, x, tol=tol, expect_native=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_reductions(dtype):
    def f(x):
        out = (x.sum(), x.sum(-1), x.sum(0, keepdim=True), x.amax(1), x.amin(0), x.any(-1), x.all(0), x.any())
        if dtype is not torch.bool:
            out += (x.prod(1), x.argmax(1), x.argmin(0), torch.max(x, 1), torch.min(x, 0))
        return out

    hi = 2 if dtype is torch.bool else 4
    lo = 0 if dtype is torch.bool else -3
    check(f, randint(lo, hi, 7, 9, dtype=dtype), expect_native=True)


@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("dtype", FLOATS)
def test_max_min_with_indices(dtype, dim):
    def f(x):
        vmax, imax = torch.max(x, dim)
        vmin, imin = torch.min(x, dim, keepdim=True)
        return vmax, imax, vmin, imin, x.argmax(dim), x.argmin(dim, keepdim=True)

    check(f, randn(9, 31, dtype=dtype), expect_native=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_argmax_argmin_all_dims(dtype):
    def f(x):
        return x.argmax(), x.argmin(), torch.argmax(x, keepdim=True), x.argmax(1, keepdim=True)

    x = randn(5, 7, 3) if dtype.is_floating_point else randint(-1000, 1000, 5, 7, 3)
    check(f, x, expect_native=True)


@pytest.mark.parametrize("dim", [-1, 0, (0, 2), None])
@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("dtype", FLOATS)
def test_var_std(dtype, correction, dim):
    def f(x):
        kw = dict(_dims_kw(dim), correction=correction)
        var, mean = torch.var_mean(x, **kw)
        out = (torch.var(x, **kw), torch.std(x, **kw), var, mean)
        if dim is not None:
            out += (torch.var(x, **kw, keepdim=True), torch.std(x, **kw, keepdim=True))
        return out

    check(f, randn(4, 6, 20, dtype=dtype) * 3 + 1, expect_native=True)


def test_reduction_dtype_arguments():
    def f(x, i):
        return (x.sum(-1, dtype=torch.float64), i.sum(0, dtype=torch.float32), x.mean(0, dtype=torch.float64),
                i.prod(1, dtype=torch.int32), x.to(torch.bfloat16).sum(-1, dtype=torch.float32),
                i.sum(), i.float().mean())

    check(f, randn(6, 10), randint(-3, 4, 6, 10), expect_native=True)


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_var_of_single_element_is_nan():
    def f(x):
        return torch.var(x, 1), torch.std(x, 1, correction=0), torch.var_mean(x, 1)

    check(f, randn(5, 1), expect_native=True)


def test_any_all_floats():
    def f(x):
        return (x > 0).any(-1), (x > 0).all(0), x.any(1), x.all(), torch.any(x > 2, dim=(0, 1))

    x = randn(5, 6, 7)
    x[0, 0] = 0
    check(f, x, expect_native=True)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset"])
def test_reductions_on_strided_inputs(layout):
    def f(x):
        return x.sum(-1), x.amax(0), x.argmax(1), x.mean()

    check(f, with_layout(randn(12, 20), layout), expect_native=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_rows_take_the_parallel_path(dtype):
    def f(x):
        return (x.sum(-1), x.amax(-1), x.argmax(-1), x.argmin(0), torch.softmax(x, -1), x.var(-1),
                x.sum(0), x.mean(), x.prod(-1).isnan(), (x > 0).any(0))

    x = with_specials(randn(96, 1031, dtype=dtype))  # rows of NaN/inf too, with a SIMD tail
    x[5] = randn(1031, dtype=dtype, seed=4)
    check(f, x, expect_native=True)


def test_reduction_of_broadcast_expression():
    def f(a, b):
        return (a * b).sum(-1), (a + b).amax(0), (a - b).mean((0, 1))

    check(f, randn(8, 1), randn(1, 13, seed=1), expect_native=True)


def test_reductions_of_zero_dim_tensor():
    def f(x):
        return x.sum(), x.amax(), x.argmax(), x.mean(), x.sum(0), x.prod()

    check(f, torch.tensor(2.5), expect_native=True)


def test_reductions_over_empty_dimension():
    def f(x):
        return x.sum(-1), x.prod(-1), x.any(-1), x.all(-1), x.sum(0), x.amax(0)

    check(f, randn(4, 0))


def test_softmax_of_empty_tensor():
    def f(x):
        return torch.softmax(x, -1), x.sum(-1, keepdim=True), x.reshape(5, 0, 2)

    check(f, randn(0, 10), expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_inf_in_reductions(dtype):
    def f(x):
        return (x.amax(-1), x.amin(0), x.sum(-1), x.argmax(-1), x.argmin(0), torch.max(x, 1), x.mean(0),
                torch.nansum(x, -1) if dtype is not torch.bfloat16 else x.sum(0), x.isnan().any(-1))

    check(f, with_specials(randn(8, 32, dtype=dtype)), expect_native=True)


def test_inf_only_rows():
    def f(x):
        return (x.amax(-1), x.argmax(-1), x.argmin(-1), x.sum(-1), torch.softmax(x, -1),
                torch.logsumexp(x, -1), torch.log_softmax(x, -1))

    x = randn(4, 8)
    x[0] = float("-inf")
    x[1] = float("inf")
    x[2, 3] = float("inf")
    check(f, x, expect_native=True)


# ----------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_log_softmax(dtype, dim):
    def f(x):
        return torch.softmax(x, dim), torch.log_softmax(x, dim), torch.logsumexp(x, dim)

    check(f, randn(6, 10, 33, dtype=dtype) * 4, expect_native=True)


def test_softmax_with_dtype_argument():
    def f(x):
        return torch.softmax(x, -1, dtype=torch.float32), torch.log_softmax(x, 0, dtype=torch.float64)

    check(f, randn(5, 17, dtype=torch.bfloat16), expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_masked_softmax(dtype):
    """Masked entries are exactly 0 and fully masked rows are NaN, as in eager."""

    def f(x, mask):
        scores = x.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, -1), torch.log_softmax(scores, -1)

    x = randn(6, 16, dtype=dtype)
    mask = randint(0, 2, 6, 16).bool()
    mask[2] = False  # a fully masked row
    mask[3] = True
    out = check(f, x, mask, expect_native=True)
    assert out is not None


def test_masked_softmax_zeros_are_exact():
    import kiln

    def f(x, mask):
        return torch.softmax(x.masked_fill(~mask, float("-inf")), -1)

    x = randn(4, 64)
    mask = torch.arange(64).expand(4, 64) < torch.tensor([[10], [64], [1], [33]])
    torch._dynamo.reset()
    got = kiln.compile(f)(x, mask)
    want = f(x, mask)
    assert torch.equal(got == 0, want == 0)
    assert torch.equal(got[2], want[2])  # a single live entry is exactly 1


# ----------------------------------------------------------------------------- normalizations
@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm(dtype):
    def f(x, w, b):
        return (F.layer_norm(x, (x.shape[-1],), w, b), F.layer_norm(x, (x.shape[-1],)),
                F.layer_norm(x, x.shape[-2:], eps=1e-3))

    x = randn(4, 6, 48, dtype=dtype) * 2 + 1
    check(f, x, randn(48, dtype=dtype, seed=1), randn(48, dtype=dtype, seed=2), expect_native=True)


def test_independent_reductions_share_one_pass_over_their_rows():
    # a LayerNorm weight gradient's two column sums: one loop reads x once for both
    from kiln.frontend.backend import REPORTS

    def f(g, x):
        return (g * x).sum(0), g.sum(0)

    g, x = randn(64, 48), randn(64, 48)
    check(f, g, x)
    (kernel,) = REPORTS[-1].kernels
    assert sum(stage.loop for stage in kernel.stages) == 1, kernel


def test_reduction_of_a_value_its_kernel_stores():
    # h.sum needs the rows' mean and variance first, although h is stored by the same kernel
    def f(x, w, b):
        h = F.layer_norm(x, (64,), w, b)
        return h, h.sum(-1), (h * x).sum(-1), x.sum(-1)

    check(f, randn(8, 64), randn(64), randn(64), expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_group_norm(dtype):
    def f(x, w, b):
        return F.group_norm(x, 4, w, b), F.group_norm(x, 1), F.group_norm(x, 8, eps=1e-3)

    x = randn(3, 8, 5, 6, dtype=dtype) * 2 + 1
    check(f, x, randn(8, dtype=dtype, seed=1), randn(8, dtype=dtype, seed=2), expect_native=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rms_norm_by_hand(dtype):
    def f(x, w):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (y.to(x.dtype) * w,)

    tol = TOLERANCE[torch.float32] if dtype is torch.float64 else None  # normalized in float32
    check(f, randn(4, 7, 64, dtype=dtype) * 3, randn(64, dtype=dtype, seed=1), tol=tol, expect_native=True)


def test_rms_norm_module():
    def f(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, eps=1e-5)

    check(f, randn(5, 32), randn(32, seed=1))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [37, 301])
def test_rows_that_start_off_16_byte_boundaries(dtype, n):
    # rows of 301 values: generated Triton splits each row into an aligned body of whole
    # vectors and a tile of the few elements around it; rows of 37, and kernels with an
    # argmax, load element by element
    def f(x, w):
        rms = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
        return (rms, torch.softmax(x, -1), F.layer_norm(x, (n,), w), x.amin(-1), (x > 0).all(-1),
                (x > 1).any(-1), x.sum(-1), (x / 4).prod(-1))

    def shifted(flat, w):  # rows 3 values further on than the outputs': not split
        return f(flat[3:].view(7, n), w)

    tol = TOLERANCE[torch.float32] if dtype is torch.float64 else None  # normalized in float32
    w = randn(n, dtype=dtype, seed=1)
    x = randn(7, n, dtype=dtype)
    x[1, 5], x[2, n - 1], x[3, 0], x[4, n // 2] = float("nan"), float("nan"), float("nan"), float("inf")
    check(f, x, w, tol=tol, expect_native=True)
    check(shifted, randn(7 * n + 3, dtype=dtype, seed=2), w, tol=tol, expect_native=True)
    check(lambda x: (x.argmax(-1), x.softmax(-1)), randn(7, n, dtype=dtype, seed=3), expect_native=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_arg_reductions_take_the_first_of_tied_extremes(dtype):
    # the extreme is found in a vectorized pass, then the first position holding it
    def f(x, y):
        return x.argmax(-1), x.argmin(-1), (x * 2 + y).argmax(-1), torch.max(x - y, -1)

    x = randint(-3, 3, 6, 1000, dtype=dtype)  # many ties in every row
    y = randint(-3, 3, 6, 1000, dtype=dtype, seed=1)
    if dtype.is_floating_point:
        x[1, 700] = float("nan")
        x[2, 5] = -0.0
    check(f, x, y, expect_native=True)

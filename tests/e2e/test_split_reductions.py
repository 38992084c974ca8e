"""Long reductions with few outputs, split into partial results and a final reduction
(passes/split_reductions.py). Outputs agree with eager; the split happens."""

import pytest
import torch
from conftest import check

# A sum of n float32 terms of size ~1 is exact to about sqrt(n) ulps of 1, in any order.
LONG_SUM_F32 = {"rtol": 1e-4, "atol": 1e-3}


def _splits(report) -> int:
    return int(next(p.summary for p in report.passes if p.name == "split").split()[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_reductions_split(dtype):
    def f(x, y):
        return x.sum(), x.amax(), (x * y).amin(), (x > 2).any(), (x > -9).all(), x.float().pow(2).mean()

    x = torch.randn(64, 1024, dtype=dtype)
    x[5, 700] = 7.5  # a unique maximum, far into the tensor
    tol = LONG_SUM_F32 if dtype == torch.float32 else None
    report = check(f, x, torch.randn(64, 1024, dtype=dtype), tol=tol, expect_native=True)
    assert _splits(report) >= 5


def test_few_rows_and_non_adjacent_axes():
    def f(x, z):
        return x.sum(-1), torch.softmax(x, -1), (x * 0.5).prod(-1), z.sum((0, 2)), z.amax((0, 2))

    x = 1 + 0.001 * torch.randn(2, 8192)  # products of values near 1 stay finite
    z = torch.randn(2048, 3, 4)
    report = check(f, x, z, tol=LONG_SUM_F32, expect_native=True)
    assert _splits(report) >= 3


def test_column_sums_of_a_layernorm_weight_gradient():
    def f(x, dy, mean, rstd):
        xhat = (x - mean) * rstd
        return (dy * xhat).sum((0, 1)), dy.sum((0, 1))

    x, dy = torch.randn(4, 1024, 48), torch.randn(4, 1024, 48)
    check(
        f, x, dy, x.mean(-1, keepdim=True), torch.rand(4, 1024, 1) + 0.5, tol=LONG_SUM_F32, expect_native=True
    )


def test_argmax_is_not_split():
    def f(x):
        return x.argmax(), x.view(-1).argmin(0)

    report = check(f, torch.randn(64, 1024), expect_native=True)
    assert _splits(report) == 0

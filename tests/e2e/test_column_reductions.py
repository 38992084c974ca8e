"""Reductions over rows of a row-major tensor (x.sum(0)): kernels that work on blocks of
neighbouring columns. Sizes are not multiples of the block, to cover the tail."""

import pytest
import torch
from conftest import check


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_reductions_with_following_stages(dtype):
    def f(x):
        centered = x - x.mean(0)
        return (x.sum(0), x.amax(0), x.argmin(0), centered.pow(2).mean(0), torch.softmax(x, 0),
                x.var(0, correction=1), (x > 0).any(0))

    x = torch.randn(37, 150, dtype=dtype)
    x[3, 7] = float("nan")
    x[5, 9] = float("inf")
    check(f, x, expect_native=True)


def test_column_reduction_of_a_3d_tensor_and_a_bias_gradient():
    def f(x, g):
        return x.sum(1), (x * g).sum((0, 1))

    x, g = torch.randn(3, 70, 130), torch.randn(3, 70, 130)
    check(f, x, g, expect_native=True)


def test_a_norms_weight_gradient_is_a_column_reduction():
    # its per-row mean and rstd are contiguous along the rows, but the same for a block of
    # columns: the kernel is still walked a block of columns at a time
    from conftest import TOLERANCE, assert_same, run_compiled

    from kiln.ir import kernel as k

    def f(x, g, mean, rstd):
        return ((x - mean) * rstd * g).sum((0, 1)), g.sum((0, 1))

    x, g = torch.randn(3, 70, 130), torch.randn(3, 70, 130)
    mean, rstd = torch.randn(3, 70, 1), torch.rand(3, 70, 1) + 0.5
    actual, report = run_compiled(f, x, g, mean, rstd)
    assert report is not None and report.kernels
    assert all(k.column_reduction(kernel) for kernel in report.kernels), report.kernels
    assert_same(actual, f(x, g, mean, rstd), TOLERANCE[torch.float32])


def test_a_softmax_down_columns_reads_its_input_again_instead_of_keeping_rows():
    # a row kept per column does not fit a block of columns: walked column by column instead,
    # every load was a new cache line
    from conftest import TOLERANCE, assert_same, run_compiled

    from kiln.ir import kernel as k

    def f(x):
        return torch.softmax(x, 0), torch.log_softmax(x, 0)

    x = torch.randn(300, 70)
    actual, report = run_compiled(f, x)
    assert report is not None and report.kernels
    assert all(k.column_reduction(kernel) and not kernel.scratch for kernel in report.kernels), report.kernels
    assert_same(actual, f(x), TOLERANCE[torch.float32])

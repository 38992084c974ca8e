"""linalg.vector_norm (torch.norm, F.normalize) as a kiln reduction: every ord, dims, keepdim
and dtype, size-1 and empty dims, forward and backward, and ConvNeXtV2's GRN block, against
eager on fresh random inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TOLERANCE, assert_same, check, run_compiled

BF16_TOL = dict(rtol=2e-2, atol=2e-2)
ORDS = [2, 1, math.inf, -math.inf, 0, 3, 0.5, -1.5]


def _tol(dtype):
    return BF16_TOL if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)


def _no_aten_norm(report):
    assert "aten.linalg_vector_norm.default" not in report.fallbacks, report.fallbacks


def _with_zeros(x: torch.Tensor) -> torch.Tensor:
    """Some exact zeros: ord 0 counts them, negative ords divide by them."""
    x = x.clone()
    x.view(-1)[::7] = 0
    return x


@pytest.mark.parametrize("ord", ORDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vector_norm_ords_and_dims(ord, dtype):
    def f(x):
        return (
            torch.linalg.vector_norm(x, ord),
            torch.linalg.vector_norm(x, ord, dim=-1),
            torch.linalg.vector_norm(x, ord, dim=(0, 2), keepdim=True),
            torch.linalg.vector_norm(x, ord, dim=1, keepdim=True),
        )

    x = _with_zeros(torch.randn(4, 5, 6, dtype=dtype))
    report = check(f, x, tol=_tol(dtype))
    _no_aten_norm(report)


@pytest.mark.parametrize("ord", [2, 1, math.inf, 0, 3])
def test_vector_norm_result_dtype(ord):
    """dtype= computes and returns in that dtype (bf16 input, float32 or float64 result)."""

    def f(x):
        return (torch.linalg.vector_norm(x, ord, dim=-1, dtype=torch.float32),
                torch.linalg.vector_norm(x.float(), ord, dim=0, dtype=torch.float64))

    report = check(f, torch.randn(6, 7).bfloat16(), tol=TOLERANCE[torch.float32])
    _no_aten_norm(report)


@pytest.mark.parametrize("ord", [2, 1, 3, -1.5, math.inf, 0])
def test_vector_norm_over_size_one_dims(ord):
    """Over dims of size 1 the norm is |x| exactly, as in eager."""

    def f(x):
        norm = torch.linalg.vector_norm
        return norm(x, ord, dim=1), norm(x, ord, dim=(1, 3), keepdim=True), norm(x[0, 0, 0, 0], ord)

    x = torch.randn(3, 1, 4, 1)
    actual, _ = run_compiled(f, x)
    expected = f(x)
    for a, e in zip(actual, expected):
        assert_same(a, e, dict(rtol=0, atol=0))


@pytest.mark.parametrize("ord", [2, 1, 0, 3])
def test_vector_norm_of_empty_tensors(ord):
    """A reduction over an empty dim is 0; an empty kept dim gives an empty result."""

    def f(x, y):
        norm = torch.linalg.vector_norm
        return norm(x, ord, dim=1), norm(y, ord, dim=1, keepdim=True), norm(x, ord)

    check(f, torch.randn(3, 0, 2), torch.randn(0, 4))


def test_norm_and_normalize_use_the_lowering():
    def f(x):
        return torch.norm(x, dim=-1), torch.norm(x, p=1), F.normalize(x, dim=1), x.norm(p=3, dim=(0, 1))

    report = check(f, torch.randn(5, 8, 3))
    _no_aten_norm(report)


def test_vector_norm_keeps_nan_and_inf():
    def f(x):
        return tuple(torch.linalg.vector_norm(x, o, dim=-1) for o in (2, 1, math.inf, -math.inf, 0, 3))

    x = torch.randn(4, 6)
    x[0, 1], x[1, 2], x[2, 3] = float("nan"), float("inf"), float("-inf")
    check(f, x)


@pytest.mark.parametrize("ord", [2, 1, 3, math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vector_norm_backward(ord, dtype):
    """Gradients of the norm through the compiled forward and backward graphs."""

    def f(x, w):
        return (torch.linalg.vector_norm(x * w, ord, dim=(1, 2), keepdim=True) * x).sum()

    torch.manual_seed(0)
    x0, w0 = torch.randn(3, 4, 5, dtype=dtype), torch.randn(5, dtype=dtype)
    xe, we = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    xk, wk = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    f(xe, we).backward()
    out, report = run_compiled(f, xk, wk)
    out.backward()
    tol = dict(rtol=5e-2, atol=5e-2) if dtype == torch.bfloat16 else TOLERANCE[dtype]
    assert_same(xk.grad, xe.grad, tol)
    assert_same(wk.grad, we.grad, tol)


def grn(x, gamma, beta):
    """ConvNeXtV2's global response normalization (NHWC)."""
    gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
    nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
    return gamma * (x * nx) + beta + x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grn_block(dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 7, 32, dtype=dtype)
    gamma, beta = torch.randn(1, 1, 1, 32, dtype=dtype), torch.randn(1, 1, 1, 32, dtype=dtype)
    report = check(grn, x, gamma, beta, tol=dict(rtol=5e-2, atol=5e-2) if dtype == torch.bfloat16 else None,
                   expect_native=True)
    assert report.num_kernels <= 3  # the norm, its mean over channels, the element-wise output


def test_grn_block_backward():
    torch.manual_seed(0)
    x0 = torch.randn(2, 5, 4, 16)
    g0, b0 = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    eager = [t.clone().requires_grad_() for t in (x0, g0, b0)]
    mine = [t.clone().requires_grad_() for t in (x0, g0, b0)]
    grn(*eager).square().sum().backward()
    out, _ = run_compiled(lambda *a: grn(*a).square().sum(), *mine)
    out.backward()
    for a, e in zip(mine, eager):
        assert_same(a.grad, e.grad, dict(rtol=1e-4, atol=1e-4))

"""Shared test helpers: compile with kiln, run on fresh random inputs, compare with eager."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

# Tests use their own kernel cache, so they never depend on a user's.
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-test-cache-"))

import kiln  # noqa: E402
from kiln.frontend.backend import REPORTS  # noqa: E402

TOLERANCE = {
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float64: dict(rtol=1e-7, atol=1e-9),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
}


def assert_same(actual, expected, tol: dict | None = None) -> None:
    """Values, shapes, dtypes and strides of (nested) outputs match eager."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, tol)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert_same_strides(actual, expected)
    if expected.is_floating_point():
        t = tol or TOLERANCE.get(expected.dtype, {})
        torch.testing.assert_close(actual, expected, equal_nan=True, **t)
    else:
        assert torch.equal(actual, expected), (actual, expected)


def assert_same_strides(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Strides match eager's in every dim of size > 1: a size-1 dim's stride never addresses
    memory (eager leaves it arbitrary), and an empty tensor has no layout to match."""
    if expected.layout != torch.strided or expected.numel() == 0:
        return
    dims = [d for d, size in enumerate(expected.shape) if size > 1]
    got, want = [actual.stride(d) for d in dims], [expected.stride(d) for d in dims]
    assert got == want, (
        f"strides {actual.stride()} vs eager {expected.stride()} (shape {tuple(expected.shape)})"
    )


def run_compiled(fn, *args, **options):
    """Compile fn with kiln (fresh Dynamo state), return (compiled result, report)."""
    torch._dynamo.reset()
    before = len(REPORTS)
    compiled = kiln.compile(fn, **options)
    out = compiled(*args)
    report = REPORTS[-1] if len(REPORTS) > before else None
    return out, report


def check(fn, *args, tol: dict | None = None, expect_native: bool = False, **options):
    """Compiled fn == eager fn on these inputs (inputs are cloned for each run)."""
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    kiln_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    expected = fn(*eager_args)
    actual, report = run_compiled(fn, *kiln_args, **options)
    assert report is not None, "kiln did not compile the graph (it ran in ATen)"
    assert_same(actual, expected, tol)
    for a, e in zip(kiln_args, eager_args):  # in-place updates of inputs match too
        if isinstance(e, torch.Tensor):
            assert_same(a, e, tol)
    if expect_native:
        assert not report.fallbacks, report.fallbacks
    return report


def randomize_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial running statistics, so eval-mode batch norm is not an identity."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return model


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield

"""A traced scan (torch's associative_scan, as transformers' Mamba calls it on its compiled
path) compiles in seconds into source that does not grow with the scan's length, and
matches eager, forward and backward."""

from __future__ import annotations

import torch
from conftest import TOLERANCE
from torch._higher_order_ops.associative_scan import associative_scan

import kiln
from kiln import errors
from kiln.frontend.backend import REPORTS


def _combine(left, right):
    a_left, b_left = left
    a_right, b_right = right
    return a_left * a_right, a_right * b_left + b_right


def selective_scan(a, b):
    return associative_scan(_combine, (a, b), dim=2, combine_mode="generic")[1]


def _compile_scan(length: int, grad: bool = False) -> int:
    """Compile and check a scan of this length; returns its kernels' source size."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    a, b = torch.rand(2, 3, length, 4), torch.randn(2, 3, length, 4)
    before, reports = len(errors.FALLBACKS), len(REPORTS)
    ak, bk = a.clone().requires_grad_(grad), b.clone().requires_grad_(grad)
    actual = kiln.compile(selective_scan)(ak, bk)
    assert len(REPORTS) > reports, "the scan did not compile"
    assert not [f for f in list(errors.FALLBACKS)[before:] if f.scope == "graph"]
    ae, be = a.clone().requires_grad_(grad), b.clone().requires_grad_(grad)
    expected = selective_scan(ae, be)
    torch.testing.assert_close(actual, expected, **TOLERANCE[torch.float32])
    if grad:
        g = torch.randn_like(expected)
        actual.backward(g)
        expected.backward(g)
        torch.testing.assert_close(ak.grad, ae.grad, **TOLERANCE[torch.float32])
        torch.testing.assert_close(bk.grad, be.grad, **TOLERANCE[torch.float32])
    return sum(len(s) for s in REPORTS[reports].sources.values())


def test_scan_source_does_not_grow_with_length():
    short, long = _compile_scan(16), _compile_scan(64)
    assert long < 2 * short, (short, long)


def test_scan_gradients():
    _compile_scan(16, grad=True)


def _step(carry, x):
    carry = carry * 0.9 + x
    return carry, torch.sin(carry)


def recurrence(init, xs):
    from torch._higher_order_ops.scan import scan

    return torch.cos(scan(_step, torch.tanh(init), xs * 2)[1]) + 1


def test_scan_op_runs_in_aten_inside_a_compiled_program():
    torch.manual_seed(0)
    for length in (8, 64):
        torch._dynamo.reset()
        init, xs = torch.randn(4, 3), torch.randn(length, 4, 3)
        before, reports = len(errors.FALLBACKS), len(REPORTS)
        actual = kiln.compile(recurrence)(init, xs)
        torch.testing.assert_close(actual, recurrence(init, xs), **TOLERANCE[torch.float32])
        records = list(errors.FALLBACKS)[before:]
        assert [(f.scope, f.kind, f.op) for f in records] == [("op", "by design", "scan")], records
        assert REPORTS[reports].num_kernels >= 2  # the element-wise ops around the scan

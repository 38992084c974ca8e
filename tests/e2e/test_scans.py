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


def _odd_even_scan(elems: tuple, dim: int) -> tuple:
    """The log-depth network associative_scan traces into, written out: combine neighbours,
    scan the half as long sequence, then fill in the even positions."""
    n = elems[0].shape[dim]
    if n < 2:
        return elems
    odd = _combine([e.narrow(dim, 0, n - 1 - n % 2)[..., ::2, :] for e in elems],
                   [e.narrow(dim, 1, n - 1 - n % 2)[..., ::2, :] for e in elems])
    odd = _odd_even_scan(odd, dim)
    even_rest = _combine([o.narrow(dim, 0, (n - 1) // 2) for o in odd],
                         [e[..., 2::2, :] for e in elems])
    out = []
    for e, o, r in zip(elems, odd, even_rest):
        even = torch.cat([e.narrow(dim, 0, 1), r], dim)
        pairs = torch.stack([even.narrow(dim, 0, o.shape[dim]), o], dim + 1).flatten(dim, dim + 1)
        out.append(torch.cat([pairs, even.narrow(dim, o.shape[dim], even.shape[dim] - o.shape[dim])], dim))
    return tuple(out)


def written_out_scan(a, b):
    return _odd_even_scan((a, b), 2)[1]


def _compile_scan(length: int, grad: bool = False) -> int:
    """Compile and check the written-out scan of this length; returns its kernels' source size."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    a, b = torch.rand(2, 3, length, 4), torch.randn(2, 3, length, 4)
    before, reports = len(errors.FALLBACKS), len(REPORTS)
    ak, bk = a.clone().requires_grad_(grad), b.clone().requires_grad_(grad)
    actual = kiln.compile(written_out_scan)(ak, bk)
    assert len(REPORTS) > reports, "the scan did not compile"
    assert not [f for f in list(errors.FALLBACKS)[before:] if f.scope == "graph"]
    ae, be = a.clone().requires_grad_(grad), b.clone().requires_grad_(grad)
    expected = written_out_scan(ae, be)
    torch.testing.assert_close(expected, selective_scan(a, b), **TOLERANCE[torch.float32])
    torch.testing.assert_close(actual, expected, **TOLERANCE[torch.float32])
    if grad:
        g = torch.randn_like(expected)
        actual.backward(g)
        expected.backward(g)
        torch.testing.assert_close(ak.grad, ae.grad, **TOLERANCE[torch.float32])
        torch.testing.assert_close(bk.grad, be.grad, **TOLERANCE[torch.float32])
    return sum(len(s) for s in REPORTS[reports].sources.values())


def test_scan_source_does_not_grow_with_length():
    """A value a kernel would compute at many indices is stored instead: the kernels of a
    log-depth network do not grow with its length."""
    short, long = _compile_scan(16), _compile_scan(64)
    assert long < 2 * short, (short, long)


def test_scan_gradients():
    _compile_scan(16, grad=True)


def test_associative_scan_runs_in_aten_by_design():
    """Until scans have a lowering of their own, a traced associative_scan runs in ATen, with
    one record that says why, forward and backward."""
    torch._dynamo.reset()
    a, b = torch.rand(2, 3, 32, 4), torch.randn(2, 3, 32, 4)
    before = len(errors.FALLBACKS)
    ak, bk = a.clone().requires_grad_(), b.clone().requires_grad_()
    actual = kiln.compile(selective_scan)(ak, bk)
    records = list(errors.FALLBACKS)[before:]
    assert [(f.scope, f.kind) for f in records] == [("graph", "by design")], records
    assert "associative_scan" in records[0].reason
    ae, be = a.clone().requires_grad_(), b.clone().requires_grad_()
    expected = selective_scan(ae, be)
    torch.testing.assert_close(actual, expected, **TOLERANCE[torch.float32])
    actual.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(ak.grad, ae.grad, **TOLERANCE[torch.float32])


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

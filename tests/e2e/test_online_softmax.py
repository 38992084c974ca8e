"""Softmax, log-softmax and cross-entropy through the online sum (reduce.expsum) equal eager
on random rows, rows with -inf, very large values, NaN, ignored targets and bf16 logits;
forward and backward. The online sum is used on rows longer than the backend keeps whole:
20000 (C++ keeps 16384, Triton 4096), 5000 (Triton: a loop over chunks); shorter rows stay
in two passes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import TOLERANCE, check, run_compiled

from kiln.frontend.backend import REPORTS
from kiln.ir.kernel import kernel_str
from kiln.passes import split_reductions


@pytest.fixture(params=["split", "one program a row"])
def row_programs(request, monkeypatch):
    """Few long rows split across programs on the GPU target (the online sum as its two
    passes, in partials); without the split, each row is one program's online pass. Every
    graph is compiled (the graph cache would hand back the other variant's program)."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
    if request.param != "split":
        monkeypatch.setattr(split_reductions, "MIN_EXTENT", 1 << 40)
    return request.param


def _rows(n: int, cols: int, dtype=torch.float32) -> torch.Tensor:
    """Random rows, then the hard ones: some -inf, all -inf, one huge value, +inf, NaN."""
    x = torch.randn(n, cols) * 4
    x[1, : cols // 3] = float("-inf")
    x[2] = float("-inf")
    x[3, 7] = 3e38 if dtype is torch.float32 else 1e38
    x[4, cols - 1] = float("inf")
    x[5, cols // 2] = float("nan")
    x[6, :5] = 80.0  # exp(80) overflows without the shift
    return x.to(dtype)


@pytest.mark.parametrize("cols", [1021, 5000, 20000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_and_log_softmax_match_eager(cols, dtype, row_programs):
    x = _rows(8, cols, dtype)
    check(lambda x: torch.softmax(x, -1), x)
    check(lambda x: torch.log_softmax(x, -1), x)


def test_softmax_over_columns_matches_eager():
    x = _rows(8, 20000).t().contiguous()
    check(lambda x: torch.softmax(x, 0), x)


def test_log_softmax_in_float32_of_bf16_rows():
    check(lambda x: torch.log_softmax(x.float(), -1), _rows(8, 20000, torch.bfloat16))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_forward_with_ignored_rows(reduction):
    x = torch.randn(8, 20000) * 3
    x[0, :10] = float("-inf")
    t = torch.randint(0, 20000, (8,))
    t[2] = t[5] = -100
    check(lambda x, t: F.cross_entropy(x, t, reduction=reduction), x, t)
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=7, reduction=reduction, label_smoothing=0.1),
          x, torch.where(t < 0, 7, t))


def _train(loss_fn, logits: torch.Tensor, targets: torch.Tensor, tol: dict):
    """Loss and logits gradient of loss_fn compiled equal eager's; the forward's report."""
    x = logits.clone().requires_grad_()
    expected = loss_fn(x, targets)
    (expected_grad,) = torch.autograd.grad(expected, x)
    before = len(REPORTS)
    y = logits.clone().requires_grad_()
    actual, _ = run_compiled(loss_fn, y, targets)
    (grad,) = torch.autograd.grad(actual, y)
    torch.testing.assert_close(actual, expected, **tol)
    torch.testing.assert_close(grad, expected_grad, **tol)
    return REPORTS[before:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("options", [dict(), dict(label_smoothing=0.2), dict(reduction="sum")])
def test_cross_entropy_forward_and_backward(dtype, options, row_programs):
    logits = (torch.randn(8, 20000) * 3).to(dtype)
    targets = torch.randint(0, 20000, (8,))
    targets[3] = -100

    def loss(x, t):
        return F.cross_entropy(x.float(), t, **options)

    reports = _train(loss, logits, targets, TOLERANCE[dtype])
    forward = next(r for r in reports if r.partition is not None)
    # the backward needs per-row values only, besides the inputs: never [8, 20000] floats
    saved = [(name, t) for name, t in forward.partition.saved if not name.startswith("primals")]
    assert not [t for _, t in saved if "20000" in t], saved
    row_kernels = [kern for kern in forward.kernels if kern.reduce_numel == 20000]
    # one pass over the logits for max and sum; label smoothing's sum of log-probabilities
    # needs both, and reads the logits once more (a second loop of the same kernel, or split
    # across programs)
    online = [kern for kern in row_kernels if "reduce.expsum" in kernel_str(kern)]
    if any("split" in p.summary and not p.summary.startswith("0 ") for r in reports for p in r.passes
           if p.name == "split"):
        return  # split across programs: the two passes, each in partials
    loops = 2 if "label_smoothing" in options else 1
    assert len(online) == 1 and sum(st.loop for st in online[0].stages) == loops
    assert row_kernels == online

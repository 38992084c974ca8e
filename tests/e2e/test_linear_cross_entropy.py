"""A linear layer read only by a cross-entropy loss runs in row chunks: the loss and the
gradients equal eager's, and the forward saves no [N, V] logits for the backward."""

import pytest
import torch
import torch.nn.functional as F
from conftest import run_compiled

from kiln.frontend import linear_xent

TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.fixture
def chunk_small_logits(monkeypatch):
    """Chunk even small logits, 3 chunks for the shapes below (49 rows of 16 float32 logits)."""
    monkeypatch.setattr(linear_xent, "MIN_LOGITS_BYTES", 0)
    monkeypatch.setattr(linear_xent, "CHUNK_LOGITS_BYTES", 20 * 64 * 4)


class Head(torch.nn.Module):
    """nanoGPT's loss: a bias-free head, logits viewed as rows, cast to float32."""

    def __init__(self, hidden: int, vocab: int, dtype: torch.dtype):
        super().__init__()
        self.head = torch.nn.Linear(hidden, vocab, bias=False, dtype=dtype)

    def forward(self, h, targets):
        logits = self.head(h)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)


def _compare(fn, params, x, *rest, dtype=torch.float32):
    """Loss and gradients (of x and params) of fn compiled equal eager's; the report."""
    x = x.requires_grad_()
    expected = fn(x, *rest)
    expected_grads = torch.autograd.grad(expected, [x, *params])
    actual, report = run_compiled(fn, x, *rest)
    grads = torch.autograd.grad(actual, [x, *params])
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, **TOLERANCE[dtype])
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, **TOLERANCE[dtype])
    return report


def _chunked(report) -> list[str]:
    return [d.reason for d in report.decisions if d.verdict == "chunked"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_head_and_its_loss_run_in_chunks(chunk_small_logits, dtype):
    model = Head(32, 64, dtype)
    h = torch.randn(7, 7, 32, dtype=dtype)
    targets = torch.randint(0, 64, (7, 7))
    targets[2, 3] = -1  # ignored
    report = _compare(model, list(model.parameters()), h, targets, dtype=dtype)
    assert "3 chunks of 20 rows" in _chunked(report)[0]
    assert not any(shape.endswith("64]") and "[49" in shape for _, shape in report.partition.saved)


@pytest.mark.parametrize("reduction, smoothing", [("sum", 0.0), ("mean", 0.1)])
def test_bias_reductions_and_label_smoothing(chunk_small_logits, reduction, smoothing):
    w, b = torch.randn(64, 32, requires_grad=True), torch.randn(64, requires_grad=True)

    def loss(x, targets):
        return F.cross_entropy(F.linear(x, w, b), targets, reduction=reduction, label_smoothing=smoothing)

    report = _compare(loss, [w, b], torch.randn(49, 32), torch.randint(0, 64, (49,)))
    assert _chunked(report)


def test_a_matmul_with_a_transposed_weight_in_inference(chunk_small_logits):
    w = torch.randn(64, 32)

    def loss(x, targets):
        return F.cross_entropy(x @ w.t(), targets)

    x, targets = torch.randn(49, 32), torch.randint(0, 64, (49,))
    with torch.no_grad():
        actual, report = run_compiled(loss, x, targets)
    torch.testing.assert_close(actual, loss(x, targets))
    assert _chunked(report)


def test_logits_read_elsewhere_are_computed_whole(chunk_small_logits):
    w = torch.randn(64, 32)

    def loss(x, targets):
        logits = x @ w.t()
        return F.cross_entropy(logits, targets), logits

    actual, report = run_compiled(loss, torch.randn(49, 32), torch.randint(0, 64, (49,)))
    assert not _chunked(report)
    assert any("read elsewhere" in d.reason for d in report.decisions if d.verdict == "kept")


def test_small_logits_are_not_chunked():
    w = torch.randn(64, 32)
    _, report = run_compiled(lambda x, t: F.cross_entropy(x @ w.t(), t), torch.randn(49, 32),
                             torch.randint(0, 64, (49,)))
    assert not _chunked(report)

"""A row kernel's stages (mean, variance, output) each read the row: Triton's persistent rows
compute each value of it once, and a costly value (a GELU) is kept in a row array by the first
loop over the row and read back by the later ones."""

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same

import kiln
from kiln.frontend.backend import REPORTS


@pytest.mark.skipif(os.environ.get("KILN_TARGET") != "triton", reason="Triton's persistent rows")
def test_a_layer_norm_loads_its_row_once():
    def f(x, y, w, b):
        return F.layer_norm(x + y, (256,), w, b, 1e-5)

    args = (torch.randn(64, 256), torch.randn(64, 256), torch.randn(256), torch.randn(256))
    torch._dynamo.reset()
    before = len(REPORTS)
    out = kiln.compile(f)(*args)
    assert_same(out, f(*args))
    (report,) = REPORTS[before:]
    (kernel,) = report.kernels
    source = report.sources[kernel.name]
    row_inputs = [p.name for p, a in zip(kernel.params, kernel.args) if not p.is_output][:2]
    for name in row_inputs:  # the row, once (its first element is read apart: the variance's shift)
        assert source.count(f"tl.load({name} + (r0 + ") == 1, source


def test_a_norm_over_a_gelu_computes_the_gelu_once_per_element():
    """A LayerNorm's mean, variance and output each read the GELU's row: the first loop over the
    row keeps it in a row array, the later ones read that back."""
    from kiln.ir import kernel as k

    b, w, bias = torch.randn(96), torch.randn(96), torch.randn(96)

    def f(x):
        return F.layer_norm(F.gelu(x + b), (96,), w, bias)

    x = torch.randn(40, 96)
    torch._dynamo.reset()
    before = len(REPORTS)
    out = kiln.compile(f)(x)
    assert_same(out, f(x))
    (report,) = REPORTS[before:]
    (kernel,) = report.kernels
    # once over the row, and for the row's first element (the variance's shift) in the mean's
    # and the variance's stages; recomputed, it would be once per element in each stage too
    gelus = [s for st in kernel.stages for s in st.body if isinstance(s, k.Compute) and s.fn == "gelu"]
    assert len(gelus) <= 3, report.sources[kernel.name]


@pytest.mark.parametrize("shape", [(64, 300), (7, 1000)])
def test_cross_entropy_reads_each_row_in_one_kernel(shape):
    """The maximum is stored for the loss's gather, and the sum of exponentials reads it: the
    kernel storing the maximum computes the sum in the same row, instead of a second kernel
    reading the logits again."""
    target = torch.randint(0, shape[1], (shape[0],))

    def f(x):
        return F.cross_entropy(x, target)

    x = torch.randn(*shape) * 3
    torch._dynamo.reset()
    before = len(REPORTS)
    out = kiln.compile(f)(x)
    assert_same(out, f(x))
    (report,) = REPORTS[before:]
    logits = [kern for kern in report.kernels if "arg0" in kern.args
              and any(st.loop for st in kern.stages) and kern.reduce and kern.reduce[-1].extent == shape[1]]
    assert len(logits) == 1, [kern.name for kern in report.kernels]
    assert any(d.verdict == "merged" and "in the same row" in d.reason for d in report.decisions)


def test_a_stored_reduction_read_at_other_rows_stays_in_its_own_kernel():
    """A later reduction over the same rows reads the maximum of other rows (a flip): its kernel
    cannot compute that maximum in its own row, so the maximum keeps a kernel of its own."""
    def f(x):
        peak = x.amax(-1, keepdim=True)
        return peak, (x - peak.flip(0)).exp().sum(-1)

    x = torch.randn(8, 32)
    torch._dynamo.reset()
    before = len(REPORTS)
    out = kiln.compile(f)(x)
    for got, want in zip(out, f(x)):
        assert_same(got, want)
    (report,) = REPORTS[before:]
    assert len(report.kernels) == 2, [kern.name for kern in report.kernels]
    assert not any(d.verdict == "merged" and "in the same row" in d.reason for d in report.decisions)

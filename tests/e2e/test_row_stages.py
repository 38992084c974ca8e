"""A row kernel holding its whole row in one tile (Triton's persistent rows) computes each value
of its row once, although its stages (mean, variance, output) each read the row."""

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

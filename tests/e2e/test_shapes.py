"""Input shapes: kiln specializes on them, compiling each new shape natively."""

import torch

import kiln
from kiln.frontend.backend import REPORTS


def test_each_new_shape_compiles_natively():
    def f(x):
        return torch.softmax(x * 2, -1)

    compiled = kiln.compile(f)
    before = len(REPORTS)
    for rows in (4, 7, 9):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(REPORTS) - before == 3  # one native compile per shape, none left to ATen

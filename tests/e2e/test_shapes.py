"""Input shapes compiled per shape (KILN_SYMBOLIC=0): kiln specializes on them, compiling each
new shape natively. tests/e2e/test_symbolic_sizes.py covers one program per shape family."""

import pytest
import torch

import kiln
from kiln.frontend.backend import REPORTS


@pytest.fixture(autouse=True)
def per_shape(monkeypatch):
    monkeypatch.setenv("KILN_SYMBOLIC", "0")


def test_each_new_shape_compiles_natively():
    def f(x):
        return torch.softmax(x * 2, -1)

    compiled = kiln.compile(f)
    before = len(REPORTS)
    for rows in (4, 7, 9):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(REPORTS) - before == 3  # one native compile per shape, none left to ATen


def test_a_graph_traced_with_symbolic_shapes_compiles_once_per_shape():
    # dynamic=True: Dynamo traces one graph with symbolic shapes; kiln compiles it for each
    # concrete shape it meets, forward and backward, and reuses it when a shape comes back
    lin = torch.nn.Linear(16, 8)

    def f(x):
        return torch.nn.functional.gelu(lin(x)).sum(-1)

    compiled = kiln.compile(f, dynamic=True)
    before = len(REPORTS)
    for rows in (4, 7, 4):
        x = torch.randn(rows, 16, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        got, want = compiled(x), f(x_eager)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad, x_eager.grad)
    assert len(REPORTS) - before == 4  # forward and backward for 4 and 7 rows; 4 again is cached
    assert all(not r.fallbacks or set(r.fallbacks) <= {"aten.addmm.default", "aten.mm.default"}
               for r in REPORTS[before:])


def test_past_the_shape_limit_new_shapes_run_in_aten(monkeypatch):
    from kiln.frontend.backend import _PerShape

    monkeypatch.setattr(_PerShape, "SHAPE_LIMIT", 2)

    def f(x):
        return torch.softmax(x * 2, -1)

    compiled = kiln.compile(f, dynamic=True)
    before = len(REPORTS)
    for rows in (3, 5, 6, 7, 3):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(REPORTS) - before == 2

"""Calls with side effects run even when nothing reads their results, in program order:
asserts, prints, copies into inputs, a collective's wait."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.frontend.backend import compile_aten_graph
from kiln.frontend.importer import import_graph
from kiln.ir.tensor import Op
from kiln.options import Options
from kiln.passes.simplify import all_rules, simplify

aten = torch.ops.aten


def _assert_large(x):
    torch._assert_async(torch.sin(x).sum() > 2.0, "sum too small")
    return x * 2


def test_unused_assert_raises():
    torch._dynamo.reset()
    compiled = kiln.compile(_assert_large)
    with pytest.raises(RuntimeError, match="sum too small"):
        compiled(torch.rand(4) * 0.1)
    x = torch.rand(16) + 1.5
    torch.testing.assert_close(compiled(x), x * 2)


def test_unused_assert_raises_in_training():
    torch._dynamo.reset()
    compiled = kiln.compile(_assert_large)
    with pytest.raises(RuntimeError, match="sum too small"):
        compiled((torch.rand(4) * 0.1).requires_grad_())
    x = (torch.rand(16) + 1.5).requires_grad_()
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))


def _compile_traced(fn, *inputs):
    gm = make_fx(fn)(*inputs)
    return compile_aten_graph(gm, list(inputs), Options())


def test_copy_into_input_runs():
    def f(x, y):
        x.copy_(torch.cos(y) * 2)
        return y + 1

    x, y = torch.randn(5, 3), torch.randn(5, 3)
    run = _compile_traced(f, x.clone(), y)
    out = run([x, y])
    torch.testing.assert_close(x, torch.cos(y) * 2)
    torch.testing.assert_close(out[0], y + 1)


def test_prints_run_in_order(capfd):
    def f(x):
        aten._print("first")
        y = torch.exp(x)
        aten._print("second")
        return y

    run = _compile_traced(f, torch.randn(3))
    capfd.readouterr()
    x = torch.randn(3)
    torch.testing.assert_close(run([x])[0], torch.exp(x))
    assert capfd.readouterr().out.split() == ["first", "second"]


def test_unused_wait_is_kept():
    wait = getattr(getattr(torch.ops, "_c10d_functional", None), "wait_tensor", None)
    if wait is None:
        pytest.skip("this torch has no functional collectives")
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4)
    w = g.call_function(wait.default, (x,))
    w.meta["val"] = torch.empty(4)
    y = g.call_function(aten.mul.Tensor, (x, 2))
    y.meta["val"] = torch.empty(4)
    g.output((y,))
    graph, _ = import_graph(fx.GraphModule({}, g), [torch.empty(4)])
    graph, _ = simplify(graph, all_rules())
    assert [n.attrs[0] for n in graph.nodes if n.op is Op.EXTERN] == [wait.default]

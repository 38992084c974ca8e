"""Graphs with many nodes compile (no recursion limit, no kernel with more arguments than a
call takes) and match eager, forward and backward.

The large graphs are traced by make_fx, forward and gradient in one graph: AOTAutograd's
functional tracing of thousands of ops would dominate the test's time. One program per
size also goes through torch.compile's whole path (Dynamo and AOTAutograd)."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import TOLERANCE
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln import errors
from kiln.frontend.backend import compile_aten_graph
from kiln.frontend.decompositions import decomposition_table
from kiln.options import Options


def cat_of_many(*xs):
    return torch.cat([x * 2 for x in xs])


def chain_of_many(n):
    def chain(x):
        for i in range(n):
            x = torch.sin(x) if i % 2 else x * 1.001 + 0.001
        return x

    return chain


def sum_of_many(*xs):
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    return total


def _program(name: str, n: int):
    torch.manual_seed(0)
    if name == "chain":
        return chain_of_many(n), [torch.randn(8)]
    return {"cat": cat_of_many, "sum": sum_of_many}[name], [torch.randn(3) for _ in range(n)]


def _no_graph_fallback(before: int) -> None:
    bad = [f for f in list(errors.FALLBACKS)[before:] if f.scope == "graph" or f.kind == "internal"]
    assert not bad, bad[:1]


@pytest.mark.parametrize("n", [400, 2000])
@pytest.mark.parametrize("program", ["cat", "chain", "sum"])
def test_many_nodes_forward_and_gradient(program, n):
    if n > 400 and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the passes under test are the same for every backend; the interpreter is slow")
    fn, inputs = _program(program, n)

    def value_and_grads(grad_out, *xs):
        xs = [x.detach().requires_grad_() for x in xs]
        out = fn(*xs)
        return (out, *torch.autograd.grad(out, xs, grad_out))

    grad_out = torch.randn_like(fn(*inputs))
    gm = make_fx(value_and_grads, decomposition_table=decomposition_table())(grad_out, *inputs)
    before = len(errors.FALLBACKS)
    compiled = compile_aten_graph(gm, [grad_out, *inputs], Options())
    _no_graph_fallback(before)
    actual = compiled([grad_out, *inputs])
    for a, e in zip(actual, value_and_grads(grad_out, *inputs)):
        torch.testing.assert_close(a, e, **TOLERANCE[torch.float32])


def test_long_chain_through_torch_compile():
    fn, (x,) = _program("chain", 400)
    torch._dynamo.reset()
    before = len(errors.FALLBACKS)
    xe, xk = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, actual = fn(xe), kiln.compile(fn)(xk)
    expected.sum().backward()
    actual.sum().backward()
    _no_graph_fallback(before)
    torch.testing.assert_close(actual, expected, **TOLERANCE[torch.float32])
    torch.testing.assert_close(xk.grad, xe.grad, **TOLERANCE[torch.float32])


def test_lowering_that_unrolls_a_dimension_runs_in_aten():
    def first_row_doubled(x):
        return x.split(1)[0] * 2

    torch.manual_seed(0)
    x = torch.randn(1500, 3)
    torch._dynamo.reset()
    before = len(errors.FALLBACKS)
    torch.testing.assert_close(kiln.compile(first_row_doubled)(x), first_row_doubled(x))
    reasons = [f.reason for f in list(errors.FALLBACKS)[before:] if f.op == "aten.split_with_sizes.default"]
    assert reasons and "proportional to a tensor's size" in reasons[0], reasons
    _no_graph_fallback(before)

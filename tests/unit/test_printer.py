"""Both IR levels print as stable, readable text (what golden tests and cache keys use)."""

from __future__ import annotations

import textwrap

import torch
from planning import plan, tensor_graph

from kiln.ir.kernel import kernel_str


def golden(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def test_tensor_ir_of_softmax_slice_and_transpose():
    graph = tensor_graph(lambda x, w: torch.softmax(x * 2, -1)[:, :4] + w.t(), torch.randn(4, 8),
                         torch.randn(4, 4))
    assert str(graph) == golden("""
        %0 = input(0, stride=[8, 1]) : f32[4, 8]
        %1 = input(1, stride=[4, 1]) : f32[4, 4]
        %2 = constant(2.0) : f32[4, 8]
        %3 = pointwise.mul(%0, %2) : f32[4, 8]
        %4 = reduce.max(%3, axes=[1]) : f32[4]
        %5 = view(%4, [d0]) : f32[4, 8]
        %6 = pointwise.sub(%3, %5) : f32[4, 8]
        %7 = pointwise.exp(%6) : f32[4, 8]
        %8 = reduce.expsum(%3, axes=[1]) : f32[4]
        %9 = constant(1.0) : f32[4]
        %10 = pointwise.div(%9, %8) : f32[4]
        %11 = view(%10, [d0]) : f32[4, 8]
        %12 = pointwise.mul(%7, %11) : f32[4, 8]
        %13 = view(%12, [d0, d1]) : f32[4, 4]
        %14 = view(%1, [d1, d0]) : f32[4, 4]
        %15 = pointwise.add(%13, %14) : f32[4, 4]
        return (%15)
    """)


def test_tensor_ir_of_padding_and_cast():
    graph = tensor_graph(lambda x: torch.nn.functional.pad(x, (1, 1)).to(torch.bfloat16), torch.randn(2, 3))
    assert str(graph) == golden("""
        %0 = input(0, stride=[3, 1]) : f32[2, 3]
        %1 = view(%0, [d0, d1 - 1] if 0 <= d1 - 1 < 3 else 0.0) : f32[2, 5]
        %2 = pointwise.cast(%1) : bf16[2, 5]
        return (%2)
    """)


def test_tensor_ir_of_extern_and_non_tensor_outputs():
    graph = tensor_graph(lambda x, w: (x @ w, x.sum()), torch.randn(2, 3), torch.randn(3, 2))
    assert str(graph) == golden("""
        %0 = input(0, stride=[3, 1]) : f32[2, 3]
        %1 = input(1, stride=[2, 1]) : f32[3, 2]
        %2 = extern(%0, %1, aten.mm.default) : f32[2, 2]
        %3 = reduce.sum(%0, axes=[0, 1]) : f32[]
        return (%2, %3)
    """)


def test_kernel_ir_of_an_element_wise_kernel():
    _, kernels = plan(lambda x, y: torch.relu(x + y), torch.randn(4, 8), torch.randn(4, 8))
    (kernel,) = kernels
    assert kernel_str(kernel) == golden("""
        kernel kiln_add_maximum_0(in0: f32, in1: f32, out out0: f32)
          outer: x0 < 4, x1 < 8
          stage 0 (loop):
            t1 = load in0[8 * x0 + x1]
            t2 = load in1[8 * x0 + x1]
            t3 = add(t1, t2) : f32
            t4 = const 0.0 : f32
            t5 = maximum(t3, t4) : f32
            store out0[8 * x0 + x1] = t5
    """)


def test_kernel_ir_of_a_row_reduction_names_its_stages():
    _, kernels = plan(lambda x: x.sum(-1), torch.randn(4, 8))
    (kernel,) = kernels
    text = kernel_str(kernel)
    assert text.startswith(golden("""
        kernel kiln_sum_0(in0: f32, out out0: f32)
          outer: x0 < 4
          reduce: r0 < 8
    """))
    assert "t1 = load in0[r0 + 8 * x0]" in text
    assert "= reduce.sum(t1)" in text and "stage 1 (row):" in text
    assert text.rstrip().endswith("store out0[x0] = t2")


def test_printing_is_stable_across_runs():
    def f(x):
        return torch.softmax(x, -1) * x.mean(0)

    x = torch.randn(4, 8)
    first, second = tensor_graph(f, x), tensor_graph(f, x)
    assert str(first) == str(second)
    assert [kernel_str(k) for k in plan(f, x)[1]] == [kernel_str(k) for k in plan(f, x)[1]]

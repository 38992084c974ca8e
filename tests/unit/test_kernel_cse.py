"""A kernel computes each value of a stage once (passes/kernel_cse.py)."""

from __future__ import annotations

import pytest
import torch
from planning import plan

import kiln
from kiln.ir import kernel as k
from kiln.ir.index import sym
from kiln.passes.kernel_cse import merge_common_values


def _two_gathers(i, w, v):
    return w[i] + v[i]


def test_two_gathers_of_one_index_normalize_and_check_it_once():
    i, w, v = torch.randint(-16, 16, (8, 32)), torch.randn(16, 4), torch.randn(16, 4)
    _, (kernel,) = plan(_two_gathers, i, w, v)
    body = [s for st in kernel.stages for s in st.body]
    assert sum(isinstance(s, k.Flag) for s in body) == 1 and len(kernel.checks) == 1, k.kernel_str(kernel)
    assert sum(isinstance(s, k.IndexValue) for s in body) == 1, k.kernel_str(kernel)

    torch._dynamo.reset()
    compiled = kiln.compile(_two_gathers)
    torch.testing.assert_close(compiled(i, w, v), _two_gathers(i, w, v))
    i[3, 5] = 16
    with pytest.raises(IndexError, match="index 16 is out of bounds for dimension 0 with size 16"):
        compiled(i, w, v)


def test_equal_values_merge_and_signed_zeros_do_not():
    f32, x0 = torch.float32, sym("x0", 8)
    body = (k.Const("a", 0.0, f32), k.Const("b", -0.0, f32), k.Const("c", 0.0, f32),
            k.Load("p", "in0", x0, f32), k.Load("q", "in0", x0, f32),
            k.Compute("s", "add", ("p", "a"), f32), k.Compute("t", "add", ("q", "c"), f32),
            k.Compute("u", "mul", ("s", "b"), f32), k.Compute("w", "mul", ("t", "b"), f32),
            k.Compute("y", "sub", ("u", "w"), f32), k.Store("out0", x0, "y", f32))
    (stage,), checks = merge_common_values((k.Stage(False, body),), ())
    assert [s.out for s in stage.body if not isinstance(s, k.Store)] == ["a", "b", "p", "s", "u", "y"]
    assert stage.body[-2] == k.Compute("y", "sub", ("u", "u"), f32) and checks == ()


def test_a_buffer_the_kernel_writes_is_loaded_again():
    f32, x0 = torch.float32, sym("x0", 8)
    body = (k.Load("p", "out0", x0, f32), k.Store("out0", x0, "p", f32), k.Load("q", "out0", x0, f32),
            k.Store("out1", x0, "q", f32))
    (stage,), _ = merge_common_values((k.Stage(False, body),), ())
    assert stage.body == body

"""The layout pass's rules on their own: eager's dimension order, the strides chosen for
computed tensors, and the order a kernel's loops walk."""

from __future__ import annotations

import torch

from kiln.ir import index as ix
from kiln.ir.tensor import Builder, Op
from kiln.lower.core import permute, pointwise, reduce
from kiln.passes.layout import ARG_STRIDES, Layouts, dense_strides, dim_order, iteration_order, order_name

NCHW = (2, 3, 4, 5)
CHANNELS_LAST = (60, 1, 15, 3)


def _input(b: Builder, position: int, shape, stride):
    return b.make(Op.INPUT, (), (position, tuple(stride)), shape, torch.float32)


def test_dim_order_and_dense_strides():
    assert dim_order(NCHW, [CHANNELS_LAST]) == (0, 2, 3, 1)
    assert dense_strides(NCHW, (0, 2, 3, 1)) == CHANNELS_LAST
    assert dim_order(NCHW, [(0, 1, 0, 0)]) == (0, 1, 2, 3)  # a broadcast decides nothing
    assert order_name(NCHW, CHANNELS_LAST) == "channels_last"
    assert order_name(NCHW, (60, 20, 5, 1)) == "contiguous"
    assert order_name((4, 5), (1, 4)) == "dims 10 outermost first"


def test_computed_tensors_follow_their_producers():
    """relu(x) of a channels_last input is channels_last; a sum over channels keeps (N, H, W)
    in order; a permute to NHWC of a channels_last tensor is contiguous; a contiguous input
    keeps everything contiguous."""
    b = Builder()
    x = _input(b, 0, NCHW, CHANNELS_LAST)
    y = _input(b, 1, NCHW, (60, 20, 5, 1))
    relu_x = pointwise(b, "maximum", x, 0.0)
    nhwc = pointwise(b, "neg", permute(b, relu_x, [0, 2, 3, 1]))
    sums = reduce(b, "sum", relu_x, [1], False, torch.float32)
    relu_y = pointwise(b, "maximum", y, 0.0)
    layouts = Layouts(b.finish([nhwc, sums, relu_y], 2))
    assert layouts(relu_x) == CHANNELS_LAST
    assert layouts(nhwc) == (60, 15, 3, 1)
    assert layouts(sums) == (20, 5, 1)
    assert layouts(relu_y) == (60, 20, 5, 1)
    assert "follows" in layouts.choice(relu_x).reason


def test_an_aten_argument_takes_the_strides_eager_hands_the_op():
    b = Builder()
    x = _input(b, 0, NCHW, (60, 20, 5, 1))
    y = pointwise(b, "neg", x)
    call = b.make(Op.EXTERN, (y,), (torch.ops.aten.relu.default, (), {}, (None,), "test", True), NCHW,
                  torch.float32, meta={ARG_STRIDES: {0: CHANNELS_LAST}})
    layouts = Layouts(b.finish([call], 1))
    assert layouts(y) == CHANNELS_LAST
    assert "read by ATen call" in layouts.choice(y).reason


def test_graph_outputs_keep_eager_strides():
    b = Builder()
    x = _input(b, 0, NCHW, CHANNELS_LAST)
    y = pointwise(b, "neg", x)
    graph = b.finish([y], 1, output_strides=[(60, 20, 5, 1)])
    assert Layouts(graph)(y) == (60, 20, 5, 1)


def test_iteration_order_follows_the_first_access_that_walks_every_loop():
    n, c, h, w = (ix.Sym(f"x{i}", e) for i, e in enumerate(NCHW))
    store = ix.as_expr(n) * 60 + ix.as_expr(c) + ix.as_expr(h) * 15 + ix.as_expr(w) * 3
    bias = ix.as_expr(c)
    assert iteration_order((n, c, h, w), [bias, store]) == (n, h, w, c)
    contiguous = ix.as_expr(n) * 60 + ix.as_expr(c) * 20 + ix.as_expr(h) * 5 + ix.as_expr(w)
    assert iteration_order((n, c, h, w), [contiguous, store]) == (n, c, h, w)
    one = ix.Sym("x4", 1)
    assert iteration_order((n, one, c, h, w), [store]) == (one, n, h, w, c)
    assert iteration_order((n, c), [bias]) == (n, c)  # nothing walks both: as given


def test_a_flipped_input_keeps_its_order():
    b = Builder()
    x = _input(b, 0, (4, 5), (5, 1))
    rows_reversed = (ix.as_expr(ix.Sym("d0", 4)) * -1 + 3, ix.as_expr(ix.Sym("d1", 5)))
    flipped = b.make(Op.VIEW, (x,), (rows_reversed, (), 0), (4, 5), torch.float32)
    y = pointwise(b, "neg", flipped)
    assert Layouts(b.finish([y], 1))(y) == (5, 1)

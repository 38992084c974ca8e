"""Each rewrite rule of passes/simplify.py on its own: it fires where its identity holds and
only there. Then simplify() as a whole: rules to a fixed point, dead code, shared nodes."""

from __future__ import annotations

import math

import pytest
import torch

from kiln.ir import index as ix
from kiln.ir.tensor import Builder, Graph, Node, Op, contiguous_strides, dim_syms
from kiln.lower import core
from kiln.passes import simplify as s

F32, F64, BF16, I32, I64, BOOL = (
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.int32,
    torch.int64,
    torch.bool,
)
SHAPE = (2, 3)


def inp(b: Builder, pos: int = 0, dtype=F32, shape=SHAPE) -> Node:
    return b.make(Op.INPUT, (), (pos, contiguous_strides(shape)), shape, dtype)


def const(b: Builder, value, dtype=F32, shape=SHAPE) -> Node:
    return b.make(Op.CONSTANT, (), (value,), shape, dtype)


def pw(b: Builder, fn: str, *inputs: Node, dtype=None) -> Node:
    dtype = dtype or inputs[-1].dtype
    return b.make(Op.POINTWISE, tuple(inputs), (fn,), inputs[-1].shape, dtype)


def cast(b: Builder, x: Node, dtype) -> Node:
    return pw(b, "cast", x, dtype=dtype)


# -- fold_constants ---------------------------------------------------------------------------


def test_fold_constants_evaluates_like_eager():
    b = Builder()
    out = s.fold_constants(b, pw(b, "add", const(b, 2.0), const(b, 3.5)))
    assert out.op is Op.CONSTANT and out.attrs == (5.5,) and out.shape == SHAPE


def test_fold_constants_rounds_in_the_node_dtype():
    b = Builder()
    out = s.fold_constants(b, pw(b, "div", const(b, 1.0, BF16), const(b, 3.0, BF16)))
    assert out.attrs[0] == (torch.tensor(1.0, dtype=BF16) / 3).item()
    assert out.attrs[0] != 1 / 3


def test_fold_constants_integer_floor_division_and_comparison():
    b = Builder()
    assert s.fold_constants(b, pw(b, "floordiv", const(b, -7, I64), const(b, 2, I64))).attrs == (-4,)
    lt = s.fold_constants(b, pw(b, "lt", const(b, 1.0), const(b, 2.0), dtype=BOOL))
    assert lt.attrs == (True,) and lt.dtype is BOOL


def test_fold_constants_casts():
    b = Builder()
    assert s.fold_constants(b, cast(b, const(b, 2.7), I64)).attrs == (2,)


def test_fold_constants_needs_every_operand_constant():
    b = Builder()
    assert s.fold_constants(b, pw(b, "add", inp(b), const(b, 1.0))) is None
    assert s.fold_constants(b, const(b, 1.0)) is None


# -- add_zero ---------------------------------------------------------------------------------


def test_add_zero_integers_either_side():
    b = Builder()
    x, zero = inp(b, dtype=I64), const(b, 0, I64)
    assert s.add_zero(b, pw(b, "add", x, zero)) is x
    assert s.add_zero(b, pw(b, "add", zero, x)) is x
    assert s.add_zero(b, pw(b, "sub", x, zero)) is x


def test_add_zero_float_keeps_the_sign_of_zero():
    b = Builder()
    x = inp(b)
    assert s.add_zero(b, pw(b, "sub", x, const(b, 0.0))) is x  # -0.0 - 0.0 == -0.0
    assert s.add_zero(b, pw(b, "add", x, const(b, -0.0))) is x  # -0.0 + -0.0 == -0.0
    assert s.add_zero(b, pw(b, "add", const(b, -0.0), x)) is x
    assert s.add_zero(b, pw(b, "add", x, const(b, 0.0))) is None  # -0.0 + 0.0 == +0.0
    assert s.add_zero(b, pw(b, "sub", x, const(b, -0.0))) is None
    assert math.copysign(1, (torch.tensor(-0.0) + 0.0).item()) > 0  # the identity that fails


def test_add_zero_does_not_fire_otherwise():
    b = Builder()
    x = inp(b, dtype=I64)
    assert s.add_zero(b, pw(b, "add", x, const(b, 1, I64))) is None
    assert s.add_zero(b, pw(b, "sub", const(b, 0, I64), x)) is None  # 0 - x == -x
    assert s.add_zero(b, pw(b, "mul", x, const(b, 0, I64))) is None
    # broadcasting: the zero decides the shape, x alone would be too small
    row = inp(b, dtype=I64, shape=(3,))
    big = b.make(Op.POINTWISE, (row, const(b, 0, I64)), ("add",), SHAPE, I64)
    assert s.add_zero(b, big) is None


# -- mul_one ----------------------------------------------------------------------------------


def test_mul_one():
    b = Builder()
    x, one = inp(b), const(b, 1.0)
    assert s.mul_one(b, pw(b, "mul", x, one)) is x
    assert s.mul_one(b, pw(b, "mul", one, x)) is x
    assert s.mul_one(b, pw(b, "div", x, one)) is x


def test_mul_one_does_not_fire_otherwise():
    b = Builder()
    x, one = inp(b), const(b, 1.0)
    assert s.mul_one(b, pw(b, "div", one, x)) is None  # 1 / x
    assert s.mul_one(b, pw(b, "mul", x, const(b, 2.0))) is None
    assert s.mul_one(b, pw(b, "add", x, one)) is None
    xi = inp(b, 1, dtype=I32)  # int * 1.0 is a float: the dtype changes
    assert s.mul_one(b, b.make(Op.POINTWISE, (xi, one), ("mul",), SHAPE, F32)) is None


# -- double_negation --------------------------------------------------------------------------


def test_double_negation():
    b = Builder()
    x = inp(b)
    assert s.double_negation(b, pw(b, "neg", pw(b, "neg", x))) is x
    assert s.double_negation(b, pw(b, "neg", x)) is None
    assert s.double_negation(b, pw(b, "neg", pw(b, "abs", x))) is None


# -- round_trip_cast --------------------------------------------------------------------------


@pytest.mark.parametrize("narrow, wide", [(BF16, F32), (F32, F64), (I32, I64), (torch.int8, I32)])
def test_round_trip_cast_through_a_wider_type(narrow, wide):
    b = Builder()
    x = inp(b, dtype=narrow)
    assert s.round_trip_cast(b, cast(b, cast(b, x, wide), narrow)) is x


@pytest.mark.parametrize(
    "start, middle, end",
    [
        (F32, BF16, F32),  # narrowing in the middle loses bits
        (F32, I64, F32),  # truncates fractions
        (I64, F64, I64),  # a double holds only 53 bits
        (BF16, F32, F64),  # ends in another dtype
        (I32, F32, I32),  # float32 holds only 24 bits
    ],
)
def test_round_trip_cast_does_not_fire_when_values_can_change(start, middle, end):
    b = Builder()
    x = inp(b, dtype=start)
    assert s.round_trip_cast(b, cast(b, cast(b, x, middle), end)) is None


# -- where ------------------------------------------------------------------------------------


def test_where_same_branches():
    b = Builder()
    c, x, y = inp(b, 0, BOOL), inp(b, 1), inp(b, 2)
    assert s.where_same_branches(b, pw(b, "where", c, x, x)) is x
    assert s.where_same_branches(b, pw(b, "where", c, x, y)) is None


def test_where_constant_condition():
    b = Builder()
    x, y = inp(b, 1), inp(b, 2)
    assert s.where_constant_condition(b, pw(b, "where", const(b, True, BOOL), x, y)) is x
    assert s.where_constant_condition(b, pw(b, "where", const(b, False, BOOL), x, y)) is y
    assert s.where_constant_condition(b, pw(b, "where", inp(b, 0, BOOL), x, y)) is None


def test_where_constant_condition_keeps_broadcast_shape():
    b = Builder()
    row = inp(b, 1, shape=(3,))
    n = b.make(Op.POINTWISE, (const(b, True, BOOL), row, inp(b, 2)), ("where",), SHAPE, F32)
    assert s.where_constant_condition(b, n) is None


# -- sum_of_one_hot ---------------------------------------------------------------------------


def one_hot_sum(b: Builder, target: Node, value: Node, scale: Node | None, dim: int = 1) -> Node:
    """sum over dim of where(iota_dim == target, value, 0) * scale, as a cross-entropy gradient has it."""
    iota = b.make(Op.IOTA, (), (dim, 0, 1), SHAPE, I64)
    hot = pw(b, "where", pw(b, "eq", iota, target, dtype=BOOL), value, const(b, 0.0))
    x = pw(b, "mul", hot, scale) if scale is not None else hot
    return b.make(Op.REDUCE, (x,), ("sum", (dim,)), tuple(n for i, n in enumerate(SHAPE) if i != dim), F32)


def row_of(b: Builder, x: Node) -> Node:
    """x (one value per row) broadcast along dimension 1."""
    return core.expand(b, core.unsqueeze(b, x, 1), SHAPE)


def test_sum_of_one_hot_becomes_the_hot_term():
    b = Builder()
    target, scale = row_of(b, inp(b, 0, I64, shape=(2,))), row_of(b, inp(b, 1, shape=(2,)))
    out = s.sum_of_one_hot(b, one_hot_sum(b, target, const(b, -1.0), scale))
    assert out is not None and out.op is Op.POINTWISE and out.fn == "where" and out.shape == (2,)
    assert not any(n.op in (Op.REDUCE, Op.IOTA) for n in s._live(b.finish([out], 2)))


def test_sum_of_one_hot_needs_terms_constant_along_the_axis():
    b = Builder()
    target = row_of(b, inp(b, 0, I64, shape=(2,)))
    varying = inp(b, 1)  # differs along dimension 1: the sum has many non-zero terms
    assert s.sum_of_one_hot(b, one_hot_sum(b, target, const(b, -1.0), varying)) is None
    assert s.sum_of_one_hot(b, one_hot_sum(b, target, varying, None)) is None
    assert s.sum_of_one_hot(b, one_hot_sum(b, inp(b, 2, I64), const(b, -1.0), None)) is None
    # a float target (2.5) may equal no index at all
    assert s.sum_of_one_hot(b, one_hot_sum(b, row_of(b, inp(b, 4, shape=(2,))), const(b, -1.0), None)) is None
    # compared with the index of another axis than the one summed
    assert (
        s.sum_of_one_hot(b, one_hot_sum(b, row_of(b, inp(b, 3, I64, shape=(2,))), const(b, 1.0), None, dim=0))
        is None
    )


# -- divide_by_softmax_sum --------------------------------------------------------------------


def row_reduce(b: Builder, kind: str, x: Node) -> Node:
    return b.make(Op.REDUCE, (x,), (kind, (1,)), (SHAPE[0],), x.dtype)


def softmax_quotient(b: Builder, x: Node, numerator: Node | None = None, shift: Node | None = None) -> Node:
    """numerator / sum(exp(x - max x)) over dimension 1; by default the numerator is the
    exponential itself (a softmax)."""
    e = pw(b, "exp", pw(b, "sub", x, row_of(b, row_reduce(b, "max", shift if shift is not None else x))))
    return pw(b, "div", numerator if numerator is not None else e, row_of(b, row_reduce(b, "sum", e)))


def test_softmax_divides_once_per_row():
    b = Builder()
    out = s.divide_by_softmax_sum(b, softmax_quotient(b, inp(b)))
    assert out is not None and out.fn == "mul"
    reciprocal = out.inputs[1].inputs[0]
    assert reciprocal.fn == "div" and reciprocal.shape == (SHAPE[0],)  # one division per row
    x = torch.randn(SHAPE) * 30
    assert torch.allclose(
        torch.softmax(x, 1),
        torch.exp(x - x.amax(1, keepdim=True))
        * (1 / torch.exp(x - x.amax(1, keepdim=True)).sum(1, keepdim=True)),
        rtol=3e-7,
        atol=0,
    )


def test_divide_by_softmax_sum_needs_the_row_maximum_of_the_same_values():
    b = Builder()
    x, y = inp(b, 0), inp(b, 1)
    assert s.divide_by_softmax_sum(b, softmax_quotient(b, x, numerator=y)) is not None  # any numerator
    # a sum of exp(x - max y) may be tiny: its reciprocal could overflow
    assert s.divide_by_softmax_sum(b, softmax_quotient(b, x, shift=y)) is None
    assert (
        s.divide_by_softmax_sum(b, pw(b, "div", y, row_of(b, row_reduce(b, "sum", pw(b, "exp", x))))) is None
    )
    assert s.divide_by_softmax_sum(b, pw(b, "div", y, x)) is None


def test_divide_by_softmax_sum_needs_each_row_shifted_by_its_own_maximum():
    # exp(x[i] - max x[1 - i]) may sum to a tiny value: its reciprocal could overflow
    b = Builder()
    x = inp(b)
    row_max = row_reduce(b, "max", x)
    d0 = dim_syms(SHAPE)[0]
    other_rows = core.view(b, row_max, [ix.as_expr(SHAPE[0] - 1) - ix.as_expr(d0)], SHAPE)
    e = pw(b, "exp", pw(b, "sub", x, other_rows))
    assert s.divide_by_softmax_sum(b, pw(b, "div", e, row_of(b, row_reduce(b, "sum", e)))) is None


# -- divide_by_power_of_two ------------------------------------------------------------------


def test_divide_by_power_of_two_multiplies_by_its_reciprocal():
    b = Builder()
    for dtype in (F32, BF16, F64):
        x = inp(b, dtype=dtype)
        for value in (4096.0, 0.25, -8.0, 2.0**100):
            out = s.divide_by_power_of_two(b, pw(b, "div", x, const(b, value, dtype)))
            assert out.fn == "mul" and out.inputs[0] is x and out.inputs[1].attrs == (1 / value,)
            assert out.dtype == dtype


def test_divide_by_power_of_two_is_exact():
    # subnormal, huge, infinite and NaN numerators included
    x = torch.cat([torch.randn(10000) * 1e3, torch.tensor([1e-40, -3e-39, 3e38, float("inf"), float("nan")])])
    for value in (4096.0, 0.125, -(2.0**60)):
        torch.testing.assert_close(x / value, x * (1 / value), rtol=0, atol=0, equal_nan=True)


def test_divide_by_power_of_two_does_not_fire_otherwise():
    b = Builder()
    x = inp(b)
    for value in (3.0, 0.0, -0.0, float("inf"), float("nan"), 2.0**127, 2.0**-127):
        assert s.divide_by_power_of_two(b, pw(b, "div", x, const(b, value))) is None, value
    assert s.divide_by_power_of_two(b, pw(b, "div", const(b, 4.0), x)) is None  # 4 / x
    half = inp(b, dtype=torch.float16)
    assert s.divide_by_power_of_two(b, pw(b, "div", half, const(b, 2.0**15, torch.float16))) is None
    assert s.divide_by_power_of_two(b, pw(b, "div", half, const(b, 2.0**14, torch.float16))) is not None
    xi = inp(b, dtype=I64)  # true division of integers: the quotient's dtype differs from x's
    true_division = b.make(Op.POINTWISE, (xi, const(b, 4.0)), ("div",), SHAPE, F32)
    assert s.divide_by_power_of_two(b, true_division) is None


def test_divide_by_power_of_two_takes_the_quotients_dtype_for_the_reciprocal():
    b = Builder()
    x = inp(b)
    for den in (const(b, 4, I64), const(b, 2.0**-20, torch.float16)):  # 2^20 is not a float16
        out = s.divide_by_power_of_two(b, b.make(Op.POINTWISE, (x, den), ("div",), SHAPE, F32))
        assert out.fn == "mul" and out.inputs[1].dtype == F32 and out.inputs[1].attrs == (1 / den.attrs[0],)


def test_every_rule_is_in_a_rule_set():
    rules = {r.__name__ for r in s.all_rules()}
    assert rules == {
        "fold_constants",
        "add_zero",
        "mul_one",
        "double_negation",
        "round_trip_cast",
        "where_same_branches",
        "where_constant_condition",
        "sum_of_one_hot",
        "divide_by_softmax_sum",
        "divide_by_power_of_two",
        "sum_of_exp_in_one_pass",
    }
    for rule in s.all_rules():
        assert rule.__doc__, f"{rule.__name__} states its identity"


# -- simplify(): fixed point, DCE, CSE --------------------------------------------------------


class GraphMaker:
    """Builds a graph node by node without sharing, so that duplicates can exist."""

    def __init__(self):
        self.nodes: list[Node] = []

    def add(self, op, inputs=(), attrs=(), shape=SHAPE, dtype=F32) -> Node:
        node = Node(len(self.nodes), op, tuple(inputs), attrs, shape, dtype)
        self.nodes.append(node)
        return node

    def graph(self, *outputs) -> Graph:
        n_inputs = sum(n.op is Op.INPUT for n in self.nodes)
        return Graph(list(self.nodes), list(outputs), n_inputs)


def test_simplify_removes_dead_nodes_and_keeps_inputs():
    g = GraphMaker()
    x, unused_input = g.add(Op.INPUT, attrs=(0, (3, 1))), g.add(Op.INPUT, attrs=(1, (3, 1)))
    g.add(Op.POINTWISE, (x,), ("exp",))  # dead
    out = g.add(Op.POINTWISE, (x,), ("sin",))
    new, fired = s.simplify(g.graph(out), s.all_rules())
    assert [n.op for n in new.nodes] == [Op.INPUT, Op.INPUT, Op.POINTWISE]
    assert new.outputs[0].fn == "sin" and new.num_inputs == 2 and not fired
    assert unused_input.id == 1


def test_simplify_shares_identical_nodes():
    g = GraphMaker()
    x = g.add(Op.INPUT, attrs=(0, (3, 1)))
    a, a2 = g.add(Op.POINTWISE, (x,), ("sin",)), g.add(Op.POINTWISE, (x,), ("sin",))
    out = g.add(Op.POINTWISE, (a, a2), ("add",))
    new, _ = s.simplify(g.graph(out, a2), s.all_rules())
    sins = [n for n in new.nodes if n.op is Op.POINTWISE and n.fn == "sin"]
    assert len(sins) == 1
    assert new.outputs[0].inputs == (sins[0], sins[0]) and new.outputs[1] is sins[0]


def test_simplify_runs_rules_to_a_fixed_point_and_counts_them():
    g = GraphMaker()
    x = g.add(Op.INPUT, attrs=(0, (3, 1)))
    one, two, three = (g.add(Op.CONSTANT, attrs=(v,)) for v in (1.0, 2.0, 3.0))
    folded = g.add(Op.POINTWISE, (two, three), ("sub",))  # -1
    neg = g.add(Op.POINTWISE, (folded,), ("neg",))  # 1
    scaled = g.add(Op.POINTWISE, (x, neg), ("mul",))  # x * 1 == x
    twice = g.add(Op.POINTWISE, (g.add(Op.POINTWISE, (scaled,), ("neg",)),), ("neg",))
    out = g.add(Op.POINTWISE, (twice, one), ("div",))
    new, fired = s.simplify(g.graph(out), s.all_rules())
    assert new.outputs[0] is new.nodes[0] and new.outputs[0].op is Op.INPUT
    assert fired == {"fold_constants": 2, "mul_one": 2, "double_negation": 1}
    assert new.nodes == [new.outputs[0]]  # what the rules replaced is dead, and removed


def test_builder_shares_equal_constants_but_not_signed_zeros():
    b = Builder()
    assert const(b, 1.5) is const(b, 1.5)
    assert const(b, float("nan")) is const(b, float("nan"))
    assert const(b, 0.0) is not const(b, -0.0)
    assert const(b, 1, I64) is not const(b, 1.0)


def test_simplify_keeps_non_tensor_outputs_and_strides():
    g = GraphMaker()
    x = g.add(Op.INPUT, attrs=(0, (3, 1)))
    graph = g.graph(x, 3, None)
    graph.output_strides = [(3, 1), None, None]
    new, _ = s.simplify(graph, s.all_rules())
    assert new.outputs[1:] == [3, None] and new.output_strides == [(3, 1), None, None]

"""Sizes of a shape family (ir/sizes.py) and index expressions over them (ir/index.py)."""

import pytest
import sympy
import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from kiln.ir import index as ix
from kiln.ir import sizes
from kiln.ir.kernel import Kernel, Load, Param, Stage, Store, kernel_str, size_params

s0, s1 = sizes.size_symbol("s0"), sizes.size_symbol("s1")


def test_comparisons_hold_only_where_they_hold_for_every_size():
    assert sizes.known_lt(s0 - 1, s0) and sizes.known_le(1, s0) and sizes.known_eq(s0 * s1, s1 * s0)
    assert not sizes.known_le(s0, s1) and not sizes.known_le(s1, s0)  # unknown: neither
    assert not sizes.known_eq(s0, s1) and not sizes.known_lt(1, s0)  # sympy alone: s0 may be 1
    assert sizes.known_divides(s1, s0 * s1) and not sizes.known_divides(2, s0)
    assert sizes.exact_div(s0 * s1 * 4, 2 * s1) == 2 * s0


def test_the_shape_envs_facts_answer_what_sympy_cannot():
    from torch._dynamo.source import ConstantSource

    env = ShapeEnv()
    a, b = (env.create_symbol(n, ConstantSource(f"size{n}"), dynamic_dim=DimDynamic.DYNAMIC) for n in (5, 7))
    assert sizes.is_symbolic(a) and sizes.is_symbolic(b)
    guards = len(env.guards)
    with sizes.family(env):
        assert sizes.known_lt(1, a)  # Dynamo's sizes are at least 2
        assert sizes.hint(a * b) == 35  # the traced example, for choices of speed
    assert not sizes.known_lt(1, a)  # outside the family, sympy alone
    assert len(env.guards) == guards  # no question added a guard


def test_dense_strides_of_a_family():
    assert sizes.dense_strides((s0, 4, s1)) == (4 * s1, s1, 1)
    assert sizes.dense_strides((3, 0, 2)) == (2, 2, 1)  # a size 0 counts as 1, as PyTorch's


def test_sizes_render_as_c_and_python_and_parse_back():
    e = 2 * s0 * s1 + s1 - 1
    assert sizes.parse(str(e)) == e
    c = sizes.render(e)
    assert eval(c.replace("/", "//"), {"s0": 3, "s1": 5}) == 34  # noqa: S307 - a test of the text
    assert eval(sizes.render(e, lang="python"), {"s0": 3, "s1": 5}) == 34  # noqa: S307
    with pytest.raises(sizes.NeedsNumber):
        sizes.render(sympy.sqrt(s0))


def test_a_negative_dividend_renders_its_floor_remainder_in_c_and_triton():
    # fftshift's shift of a family, -(n // 2) % n: C's (and Triton's) % truncates, which made a
    # negative gather index; the rendered form must hold under both conventions
    from torch.utils._sympy.functions import FloorDiv, PythonMod

    shift, quotient = PythonMod(-FloorDiv(s0, 2), s0), FloorDiv(s1 - 2 * s0, 3)
    for n0, n1 in ((7, 3), (50, 1), (1, 9)):
        values = {"s0": n0, "s1": n1}
        assert _truncating_eval(sizes.render(shift), values) == (-(n0 // 2)) % n0
        assert _truncating_eval(sizes.render(quotient), values) == (n1 - 2 * n0) // 3
        assert eval(sizes.render(shift, lang="python"), values) == (-(n0 // 2)) % n0  # noqa: S307


def test_sympys_floor_of_a_quotient_renders_as_a_floor_division():
    # FloorDiv(-1, n // 4) evaluates to sympy's floor(-1/(n // 4)): an index's lower bound
    from torch.utils._sympy.functions import FloorDiv

    e = sympy.floor(-1 / FloorDiv(s0, 4))
    for n in (4, 7, 9, 100):
        assert _truncating_eval(sizes.render(e), {"s0": n}) == -1 // (n // 4)
        assert eval(sizes.render(e, lang="python"), {"s0": n}) == -1 // (n // 4)  # noqa: S307


def test_a_relation_with_a_quotient_is_not_handed_to_the_shape_env():
    # its range analysis fails on s1**-1 and logs a warning each time
    import logging

    from torch._dynamo.source import ConstantSource

    env = ShapeEnv()
    a, b = (env.create_symbol(n, ConstantSource(f"size{n}"), dynamic_dim=DimDynamic.DYNAMIC) for n in (5, 7))
    logged = []
    handler = logging.Handler()
    handler.emit = logged.append
    logger = logging.getLogger("torch.utils._sympy.interp")
    logger.addHandler(handler)
    try:
        with sizes.family(env):
            assert not sizes.known_le(a / b, 1) and not sizes.known_eq(a * b**-1, 2)
    finally:
        logger.removeHandler(handler)
    assert not [r for r in logged if r.levelno >= logging.WARNING], [r.getMessage() for r in logged]


def _truncating_eval(text: str, values: dict) -> int:
    """An integer expression as C computes it: / and % truncate toward zero."""
    import ast
    import math

    def go(node) -> int:
        if isinstance(node, ast.Expression):
            return go(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -go(node.operand)
        a, b = go(node.left), go(node.right)
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
        if isinstance(node.op, ast.Div):
            return int(a / b)
        if isinstance(node.op, ast.Mod):
            return int(math.fmod(a, b))
        return ops[type(node.op)]

    return go(ast.parse(text, mode="eval"))


def test_index_splits_are_made_only_where_they_hold_for_every_size():
    x0, x1 = ix.sym("x0", s0), ix.sym("x1", s1)
    flat = x0 * s1 + x1
    assert flat // s1 == x0 and flat % s1 == x1  # x1 < s1: exact for every size
    assert (flat // s1) * s1 + flat % s1 == flat
    kept = (x1 + 3) // s1  # x1 + 3 may reach s1: the division stays
    assert isinstance(kept.terms[0][0], ix.FloorDiv)
    assert str(ix.floordiv(x0 * (2 * s1) + x1, 2)) == "(x1 // 2) + s1 * x0"


def test_kernels_of_different_families_share_one_text():
    def kernel(a, b):
        x0, x1 = ix.Sym("x0", a), ix.Sym("x1", b)
        index = ix.as_expr(x0) * b + ix.as_expr(x1)
        body = (Load("t0", "in0", index, torch.float32), Store("out0", index, "t0", torch.float32))
        params = (Param("in0", torch.float32, False), Param("out0", torch.float32, True))
        return Kernel("k", (x0, x1), (), params, (Stage(False, body),))

    p, q = sizes.size_symbol("s7"), sizes.size_symbol("s9")
    one, other = size_params(kernel(s0, s1)), size_params(kernel(p, q))
    assert kernel_str(one) == kernel_str(other) and "ks1 * x0" in kernel_str(one)
    assert one.sizes == (s0, s1) and other.sizes == (p, q)


@pytest.mark.skipif(not hasattr(torch, "sym_sum"), reason="torch.sym_sum")
def test_a_sum_of_sizes_in_one_call_is_their_sum():
    """Dynamo of some torch versions writes s0 + 1 as torch.sym_sum((1, s0))."""
    assert sizes.size_call(torch.sym_sum, ((1, s0, s1),), {}) == s0 + s1 + 1
    assert sizes.size_call(torch.sym_sum, ((1, 2),), {}) is None  # plain ints: the importer's

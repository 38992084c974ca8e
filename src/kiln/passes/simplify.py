"""Graph simplification: dead-code elimination, common subexpressions, constant folding
and algebraic identities.

A rule is a small function (builder, node) -> replacement or None whose docstring states
the identity. Rules see a node whose inputs were already simplified. Rebuilding the graph
through a Builder shares identical nodes (CSE) and visits only what the outputs need (DCE).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from kiln.ir import index as ix
from kiln.ir.ops import POINTWISE_FNS
from kiln.ir.sizes import is_symbolic, known_le, numel
from kiln.ir.tensor import Builder, Graph, Node, Op, dim_syms
from kiln.lower import core

Rule = Callable[[Builder, Node], "Node | None"]


def _const(n: Node):
    """A constant's number; None for other nodes and for a shape family's size (a value
    known only at run time, which no rule may fold)."""
    return n.attrs[0] if n.op is Op.CONSTANT and not is_symbolic(n.attrs[0]) else None


def _is_const(n: Node, value) -> bool:
    c = _const(n)
    return c is not None and not isinstance(c, bool) and c == value and c == c


def fold_constants(b: Builder, n: Node) -> Node | None:
    """f(c1, c2, ...) == c when every operand is a constant: evaluated with torch, as eager would."""
    if n.op is not Op.POINTWISE or not all(_const(i) is not None for i in n.inputs):
        return None
    operands = [torch.tensor(i.attrs[0], dtype=i.dtype) for i in n.inputs]
    value = POINTWISE_FNS[n.fn].eval(*operands).to(n.dtype).item()
    return b.make(Op.CONSTANT, (), (value,), n.shape, n.dtype)


def add_zero(b: Builder, n: Node) -> Node | None:
    """x + (-0.0) == x - 0.0 == x (for integers, any zero). Not x + 0.0: at x = -0.0 it is
    +0.0."""
    if n.op is not Op.POINTWISE or n.fn not in ("add", "sub"):
        return None
    x, y = n.inputs
    if _is_zero(y, negative=n.fn == "add"):
        return _same(n, x)
    if n.fn == "add" and _is_zero(x, negative=True):
        return _same(n, y)
    return None


def _is_zero(n: Node, negative: bool) -> bool:
    """n is a constant zero; for floats, with the given sign."""
    if not _is_const(n, 0):
        return False
    return not n.dtype.is_floating_point or (math.copysign(1.0, n.attrs[0]) < 0) == negative


def mul_one(b: Builder, n: Node) -> Node | None:
    """x * 1 == x / 1 == x."""
    if n.op is Op.POINTWISE and n.fn in ("mul", "div") and _is_const(n.inputs[1], 1):
        return _same(n, n.inputs[0])
    if n.op is Op.POINTWISE and n.fn == "mul" and _is_const(n.inputs[0], 1):
        return _same(n, n.inputs[1])
    return None


def double_negation(b: Builder, n: Node) -> Node | None:
    """-(-x) == x."""
    if n.op is Op.POINTWISE and n.fn == "neg":
        inner = n.inputs[0]
        if inner.op is Op.POINTWISE and inner.fn == "neg":
            return inner.inputs[0]
    return None


_EXACT_WIDENING = {
    torch.bfloat16: (torch.float32, torch.float64),
    torch.float16: (torch.float32, torch.float64),
    torch.float32: (torch.float64,),
    torch.int8: (torch.int16, torch.int32, torch.int64),
    torch.int16: (torch.int32, torch.int64),
    torch.int32: (torch.int64,),
}


def round_trip_cast(b: Builder, n: Node) -> Node | None:
    """cast(cast(x, wide), narrow) == x when narrow is x's dtype and wide holds every value of it."""
    if n.op is Op.POINTWISE and n.fn == "cast":
        inner = n.inputs[0]
        if inner.op is Op.POINTWISE and inner.fn == "cast":
            x = inner.inputs[0]
            if x.dtype == n.dtype and inner.dtype in _EXACT_WIDENING.get(x.dtype, ()):
                return x
    return None


def where_same_branches(b: Builder, n: Node) -> Node | None:
    """where(c, x, x) == x."""
    if n.op is Op.POINTWISE and n.fn == "where" and n.inputs[1] is n.inputs[2]:
        return _same(n, n.inputs[1])
    return None


def where_constant_condition(b: Builder, n: Node) -> Node | None:
    """where(True, a, b) == a; where(False, a, b) == b."""
    if n.op is Op.POINTWISE and n.fn == "where" and n.inputs[0].op is Op.CONSTANT:
        return _same(n, n.inputs[1] if n.inputs[0].attrs[0] else n.inputs[2])
    return None


def sum_of_one_hot(b: Builder, n: Node) -> Node | None:
    """sum over d of where(iota_d == e, a, 0) * q == where(0 <= e < n_d, a * q, 0) when e, a
    and q do not vary along d: at most one term is not zero. (An inf or NaN q would make the
    other terms NaN; the pattern is a one-hot scatter, whose other terms eager leaves zero.)"""
    if n.op is not Op.REDUCE or n.attrs[0] != "sum" or len(n.attrs[1]) != 1:
        return None
    (d,), x = n.attrs[1], n.inputs[0]
    if x.dtype != n.dtype:
        return None
    factors = [x]
    if _is_pointwise(x, "mul"):
        factors = sorted(x.inputs, key=lambda f: not _is_pointwise(f, "where"))
    one_hot, others = factors[0], factors[1:]
    if not _is_pointwise(one_hot, "where") or not _is_const(one_hot.inputs[2], 0):
        return None
    cond, value = one_hot.inputs[0], one_hot.inputs[1]
    if not _is_pointwise(cond, "eq"):
        return None
    iotas = [i for i in cond.inputs if i.op is Op.IOTA and i.attrs == (d, 0, 1)]
    if not iotas:
        return None
    target = cond.inputs[1] if cond.inputs[0] is iotas[0] else cond.inputs[0]
    if target.dtype.is_floating_point or target.dtype is torch.bool:  # 2.5 equals no index
        return None
    if not all(_constant_along(v, d) for v in (target, value, *others)):
        return None
    kept = [s for i, s in enumerate(x.shape) if i != d]
    index_map = [ix.as_expr(s) for s in dim_syms(tuple(kept))]
    index_map.insert(d, ix.as_expr(0))

    def drop(v: Node) -> Node:
        return core.view(b, v, index_map, kept)

    result = drop(value)
    for other in others:
        result = core.pointwise(b, "mul", result, drop(other))
    t = drop(target)
    in_range = core.pointwise(b, "logical_and", core.pointwise(b, "ge", t, 0),
                              core.pointwise(b, "lt", t, x.shape[d]))
    return _same(n, core.pointwise(b, "where", in_range, result, core.constant(b, 0, n.dtype, n.shape)))


def divide_by_softmax_sum(b: Builder, n: Node) -> Node | None:
    """a / s == a * (1 / s), within 1.5 ulps, where s is a sum of exp(x - max x) over the
    same axes (written out, or as reduce.expsum): s >= 1, so its reciprocal neither overflows
    nor loses precision, and it is computed once per row instead of a division per element
    (eager's CPU softmax multiplies by the reciprocal too)."""
    if not _is_pointwise(n, "div") or n.dtype is not torch.float32:
        return None
    a, den = n.inputs
    if den.op is not Op.VIEW or den.attrs[1]:
        return None
    total = den.inputs[0]
    if total.op is not Op.REDUCE:
        return None
    is_sum_of_exp = total.attrs[0] == "sum" and _exp_less_own_max(total.inputs[0], total.attrs[1]) is not None
    if not (is_sum_of_exp or total.attrs[0] == "expsum"):
        return None
    reciprocal = core.pointwise(b, "div", core.constant(b, 1, total.dtype), total)
    return _same(n, core.pointwise(b, "mul", a, core.view(b, reciprocal, den.attrs[0], den.shape)))


def sum_of_exp_in_one_pass(b: Builder, n: Node, row_kept: int = 0) -> Node | None:
    """sum(exp(x - max x)) over axes == expsum(x) over axes: the online form keeps a running
    maximum m and a sum rescaled whenever m rises (m' = max(m, x); s' = s * exp(m - m') +
    exp(x - m')), so a row is read once instead of once for its maximum and once for the
    sum. Equal up to the rescales' roundings; the maximum itself stays a reduce.max, which
    the same loop computes. Rows of at most row_kept elements, which a backend keeps whole
    (all_rules), are left in two passes: read once either way, they compute each exp once,
    which softmax's numerator reads too."""
    if n.op is not Op.REDUCE or n.attrs[0] != "sum" or n.dtype not in (torch.float32, torch.float64):
        return None
    if known_le(numel(tuple(n.inputs[0].shape[a] for a in n.attrs[1])), row_kept):
        return None
    x = _exp_less_own_max(n.inputs[0], n.attrs[1])
    if x is None or x.dtype != n.dtype:
        return None
    return _same(n, b.make(Op.REDUCE, (x,), ("expsum", n.attrs[1]), n.shape, n.dtype))


def _exp_less_own_max(e: Node, axes: tuple[int, ...]) -> Node | None:
    """x where e is exp(x - max x), the maximum over axes taken in x's own row (a view taking
    another row's maximum could leave the sum tiny); None otherwise."""
    if not _is_pointwise(e, "exp"):
        return None
    shifted = e.inputs[0]
    if not _is_pointwise(shifted, "sub") or shifted.inputs[1].op is not Op.VIEW:
        return None
    x, row_max = shifted.inputs[0], shifted.inputs[1].inputs[0]
    if row_max.op is not Op.REDUCE or row_max.attrs != ("max", axes) or row_max.inputs[0] is not x:
        return None
    own_row = tuple(ix.as_expr(d) for i, d in enumerate(dim_syms(x.shape)) if i not in axes)
    if shifted.inputs[1].attrs[:2] != (own_row, ()):
        return None
    return x


def divide_by_power_of_two(b: Builder, n: Node) -> Node | None:
    """x / 2^k == x * 2^-k for floating x when 2^k and 2^-k are both normal numbers of x's
    dtype: each side is the one rounding of the same real number. (A mean over rows of 4096
    divides by 4096: one multiplication where an IEEE division takes eight instructions or more.)"""
    if not _is_pointwise(n, "div") or not n.dtype.is_floating_point:
        return None
    x, den = n.inputs
    value = _const(den)
    if x.dtype != n.dtype or value is None or isinstance(value, bool):
        return None
    if not math.isfinite(value) or value == 0:
        return None
    if abs(math.frexp(value)[0]) != 0.5 or min(abs(value), 1 / abs(value)) < torch.finfo(n.dtype).tiny:
        return None
    reciprocal = core.constant(b, 1 / value, n.dtype, den.shape)
    return _same(n, core.pointwise(b, "mul", x, reciprocal, out_dtype=n.dtype))


def _is_pointwise(n: Node, fn: str) -> bool:
    return n.op is Op.POINTWISE and n.fn == fn


def _constant_along(n: Node, d: int) -> bool:
    """n's value does not depend on its index along dimension d (conservatively)."""
    if n.op is Op.CONSTANT:
        return True
    if n.op is Op.IOTA:
        return n.attrs[0] != d
    if n.op is Op.VIEW:
        index_map, valid, _ = n.attrs
        axis = dim_syms(n.shape)[d]
        return all(axis not in e.symbols() for e in (*index_map, *(v for v, _ in valid)))
    if n.op is Op.POINTWISE:
        return all(_constant_along(i, d) for i in n.inputs)
    return False


def _same(n: Node, candidate: Node) -> Node | None:
    ok = candidate.shape == n.shape and candidate.dtype == n.dtype
    return candidate if ok else None


RULE_SETS: dict[str, list[Rule]] = {
    "fold": [fold_constants],
    "identities": [add_zero, mul_one, double_negation, round_trip_cast, where_same_branches,
                   where_constant_condition, sum_of_one_hot, divide_by_softmax_sum, divide_by_power_of_two],
    # one pass over a row where two would read it twice (log-softmax, cross-entropy, softmax)
    "online": [sum_of_exp_in_one_pass],
}


def simplify(graph: Graph, rules: list[Rule]) -> tuple[Graph, dict[str, int]]:
    """Rebuild graph applying rules to a fixed point per node; returns counts of rules fired."""
    graph, fired = _rebuild(graph, rules)
    if fired:  # nodes the rules replaced are dead now
        graph, _ = _rebuild(graph, [])
    return graph, fired


def _rebuild(graph: Graph, rules: list[Rule]) -> tuple[Graph, dict[str, int]]:
    needed = _live(graph)
    b = Builder()
    new: dict[Node, Node] = {}
    fired: dict[str, int] = {}
    for n in graph.nodes:
        if n not in needed:
            continue
        inputs = tuple(new[i] for i in n.inputs)
        node = b.make(n.op, inputs, n.attrs, n.shape, n.dtype, n.meta)
        changed = True
        while changed:
            changed = False
            for rule in rules:
                out = rule(b, node)
                if out is not None and out is not node:
                    assert out.shape == n.shape and out.dtype == n.dtype, rule.__name__
                    fired[rule.__name__] = fired.get(rule.__name__, 0) + 1
                    node, changed = out, True
                    break
        new[n] = node
    outputs = [new[o] if isinstance(o, Node) else o for o in graph.outputs]
    out = b.finish(outputs, graph.num_inputs, graph.output_strides, graph.output_fresh, graph.output_storage)
    out.size_inputs = list(graph.size_inputs)
    return out, fired


def _live(graph: Graph) -> set[Node]:
    """What the outputs need, the inputs, and every call with side effects (an assert whose
    result nobody reads still runs, with what it reads)."""
    live, stack = set(), list(graph.output_nodes())
    stack += [n for n in graph.nodes if n.op is Op.INPUT or n.meta.get("effectful")]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(n.inputs)
    return live


def all_rules(row_kept: int = 0) -> list[Rule]:
    """Every rule; row_kept: the longest row the backend keeps whole (Backend.row_scratch_limit),
    which sum_of_exp_in_one_pass leaves in two passes."""
    rules = [r for rules in RULE_SETS.values() for r in rules]
    if not row_kept:
        return rules

    def online(b: Builder, n: Node) -> Node | None:
        return sum_of_exp_in_one_pass(b, n, row_kept)

    online.__name__ = online.__qualname__ = sum_of_exp_in_one_pass.__name__
    online.__doc__ = sum_of_exp_in_one_pass.__doc__
    return [online if r is sum_of_exp_in_one_pass else r for r in rules]

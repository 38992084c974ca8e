"""An evaluator of the tensor IR (level 1) with torch ops: the reference a kernel is checked
against (tools/check.py).

Each node is computed from its inputs with the torch function of its op: element-wise
functions through ir/ops.py's table, views and gathers by indexing with their index maps
evaluated on index grids, reductions with torch's reductions. `wide=True` computes every
floating-point node in float64 (integers and booleans keep their dtypes); otherwise each node
is rounded to its own dtype, as eager computes op by op.

Sizes come from the given tensors where the IR holds a symbol for them: a node's shape is an
int or an expression over size symbols, bound from the given tensors' actual shapes.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from kiln.ir.checks import RULES
from kiln.ir.index import Expr, FloorDiv, Mod, Sym
from kiln.ir.ops import POINTWISE_FNS
from kiln.ir.tensor import MATERIALIZED, Node, Op, dim_syms, value_sym


class NotEvaluable(Exception):
    """A node the evaluator cannot compute (an unknown function, an unbound size)."""


def subgraph(roots: list[Node], given: set[Node]) -> list[Node]:
    """The nodes computing roots from the given nodes, in graph (topological) order; given
    nodes are not included, nor walked through."""
    seen: set[Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen or n in given:
            continue
        seen.add(n)
        stack.extend(n.inputs)
    return sorted(seen, key=lambda n: n.id)


def largest_tensor(roots: list[Node], given: dict[Node, torch.Tensor]) -> int:
    """Elements of the largest tensor evaluating roots from the given tensors would make."""
    sizes = _SizeBinding(given)
    nodes = subgraph(roots, set(given))
    return max((math.prod(sizes.shape(n)) for n in nodes), default=0)


def evaluate(roots: list[Node], given: dict[Node, torch.Tensor], wide: bool,
             noise: torch.Generator | None = None) -> dict[Node, torch.Tensor]:
    """The values of roots (and of every node between them and the given tensors).
    wide: floats in float64; else each node in its own dtype. noise (with wide): each float
    node's value is scaled by a random 1 + u * its dtype's ulp, u uniform in [-1, 1], and a
    sum moves by another u * ulp * sqrt(n) * the sum of its n terms' magnitudes (the rounding
    of its partial sums, in whatever order a kernel adds them), so that the spread of a few
    such evaluations measures how far rounding moves each element."""
    sizes = _SizeBinding(given)
    values: dict[Node, torch.Tensor] = {}
    for node, tensor in given.items():
        values[node] = _widened(tensor, wide)
    for node in subgraph(roots, set(given)):
        if node.op in MATERIALIZED and not _in_kernel_matmul(node):
            raise NotEvaluable(f"%{node.id} ({node.op.value}) is computed outside kernels and was not given")
        evaluate_node = _matmul if node.op is Op.EXTERN else _EVALUATORS[node.op]
        out = evaluate_node(node, [values[i] for i in node.inputs], sizes)
        out = out.to(value_dtype(node.dtype, wide))
        if noise is not None and wide and node.dtype.is_floating_point and node.op is not Op.CONSTANT:
            out = _perturbed(node, out, values, noise)
        values[node] = out
    return values


def _perturbed(node: Node, out: torch.Tensor, values: dict[Node, torch.Tensor],
               noise: torch.Generator) -> torch.Tensor:
    eps = torch.finfo(node.dtype).eps

    def uniform() -> torch.Tensor:
        return torch.rand(out.shape, generator=noise, dtype=torch.float64) * 2 - 1

    moved = out * (1 + uniform() * eps)
    if node.op is Op.REDUCE and node.attrs[0] == "sum" and node.attrs[1]:
        terms = values[node.inputs[0]]
        n = math.prod(terms.shape[a] for a in node.attrs[1])
        magnitude = terms.abs().to(torch.float64).sum(dim=tuple(node.attrs[1]))
        moved = moved + uniform() * eps * math.sqrt(n) * magnitude
    if node.op is Op.EXTERN:  # a matmul's sums along k, in float32 (its dtype's for 16-bit ones)
        a, b = (values[node.inputs[r.index]] for r in node.attrs[1][-2:])
        magnitude = torch.mm(a.abs(), b.abs())
        moved = moved + uniform() * torch.finfo(torch.float32).eps * math.sqrt(a.shape[-1]) * magnitude
    return moved


def value_dtype(dtype: torch.dtype, wide: bool) -> torch.dtype:
    return torch.float64 if wide and dtype.is_floating_point else dtype


def _widened(t: torch.Tensor, wide: bool) -> torch.Tensor:
    return t.to(torch.float64) if wide and t.is_floating_point() else t


class _SizeBinding:
    """Sizes as ints: an int stays; an expression (a sympy one, with symbolic shapes) is
    evaluated with its symbols bound from the given tensors' shapes."""

    def __init__(self, given: dict[Node, torch.Tensor]):
        self.symbols: dict[Any, int] = {}
        for node, tensor in given.items():
            for s, actual in zip(node.shape, tensor.shape):
                if not isinstance(s, int) and getattr(s, "is_Symbol", False):
                    self.symbols[s] = int(actual)

    def __call__(self, s: Any) -> int:
        if isinstance(s, int):
            return s
        subs = getattr(s, "xreplace", None)
        if subs is not None:
            value = subs(self.symbols)
            if getattr(value, "is_number", False):
                return int(value)
        raise NotEvaluable(f"size {s} is not bound by the kernel's buffers")

    def shape(self, node: Node) -> tuple[int, ...]:
        return tuple(self(s) for s in node.shape)


# ---- index maps ------------------------------------------------------------------------------


def _grids(shape: tuple[int, ...], names: tuple[Sym, ...]) -> dict[str, torch.Tensor]:
    """Each dimension's index, shaped to broadcast over shape."""
    out = {}
    for d, (sym, n) in enumerate(zip(names, shape)):
        view = [1] * len(shape)
        view[d] = n
        out[sym.name] = torch.arange(n, dtype=torch.int64).view(view)
    return out


def _index_value(e: Expr, env: dict[str, torch.Tensor], sizes: _SizeBinding) -> torch.Tensor | int:
    out: torch.Tensor | int = sizes(e.const)
    for atom, coef in e.terms:
        out = out + _atom_value(atom, env, sizes) * sizes(coef)
    return out


def _atom_value(atom, env: dict[str, torch.Tensor], sizes: _SizeBinding) -> torch.Tensor | int:
    if isinstance(atom, Sym):
        if atom.name not in env:
            raise NotEvaluable(f"index symbol {atom.name} has no value")
        return env[atom.name]
    inner = _index_value(atom.arg, env, sizes)
    divisor = sizes(atom.divisor)
    if isinstance(atom, FloorDiv):
        return inner // divisor
    assert isinstance(atom, Mod)
    return inner % divisor


def _take(src: torch.Tensor, index: list[torch.Tensor | int], shape: tuple[int, ...],
          valid: torch.Tensor | None, fill: Any) -> torch.Tensor:
    """src at the given index (one per source dimension, broadcast to shape); where valid is
    false, fill, and the index there is not read."""
    if src.numel() == 0 or not index:
        base = src.reshape(()).expand(shape) if src.numel() else torch.zeros(shape, dtype=src.dtype)
        out = base.clone()
    else:
        safe = []
        for d, i in enumerate(index):
            i = torch.as_tensor(i, dtype=torch.int64)
            if valid is not None:  # where a view is not valid its index may point anywhere
                i = torch.where(valid, i, 0).clamp(0, src.shape[d] - 1)
            safe.append(i)
        out = src[tuple(safe)].expand(shape)
    if valid is not None:
        out = torch.where(valid, out, torch.tensor(fill, dtype=out.dtype))
    return out


# ---- one evaluator per op --------------------------------------------------------------------


def _constant(node: Node, inputs: list[torch.Tensor], sizes: _SizeBinding) -> torch.Tensor:
    return torch.full(sizes.shape(node), node.attrs[0], dtype=torch.float64
                      if node.dtype.is_floating_point else node.dtype)


def _iota(node: Node, inputs: list[torch.Tensor], sizes: _SizeBinding) -> torch.Tensor:
    dim, start, step = node.attrs
    shape = sizes.shape(node)
    view = [1] * len(shape)
    view[dim] = shape[dim]
    values = start + step * torch.arange(shape[dim], dtype=torch.int64)
    return values.view(view).expand(shape)


def _pointwise(node: Node, inputs: list[torch.Tensor], sizes: _SizeBinding) -> torch.Tensor:
    fn = POINTWISE_FNS.get(node.fn)
    if fn is None:
        raise NotEvaluable(f"no evaluator for element-wise function {node.fn}")
    shape = sizes.shape(node)
    if node.fn in _INTEGER_DIVISIONS and not any(t.is_floating_point() for t in inputs):
        out = _integer_division(fn.eval, node.fn, *inputs)
    else:
        out = fn.eval(*inputs)
    return out.expand(shape) if tuple(out.shape) != shape else out


_INTEGER_DIVISIONS = frozenset({"floordiv", "truncdiv", "remainder", "fmod"})


def _integer_division(fn: Callable, name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """An integer division as torch computes it, except where torch's CPU kernels would
    crash the process (the smallest integer divided by -1 traps): by -1, the quotient is the
    wrapping negation and the remainder 0. By zero eager raises: nothing to compare."""
    b = torch.as_tensor(b)
    if bool((b == 0).any()):
        raise NotEvaluable("an integer division by zero (eager raises)")
    by_minus_one = b == -1
    out = fn(a, torch.where(by_minus_one, 1, b))
    negated = torch.neg(a) if name in ("floordiv", "truncdiv") else torch.zeros_like(a)
    return torch.where(by_minus_one, negated.to(out.dtype), out)


def _view(node: Node, inputs: list[torch.Tensor], sizes: _SizeBinding) -> torch.Tensor:
    index_map, valid_conds, fill = node.attrs
    shape = sizes.shape(node)
    env = _grids(shape, dim_syms(node.shape))
    valid = None
    for e, n in valid_conds:
        v = _index_value(e, env, sizes)
        ok = (torch.as_tensor(v) >= 0) & (torch.as_tensor(v) < sizes(n))
        valid = ok if valid is None else valid & ok
    if valid is not None:
        valid = valid.expand(shape)
    index = [_index_value(e, env, sizes) for e in index_map]
    return _take(inputs[0], index, shape, valid, fill)


def _gather(node: Node, inputs: list[torch.Tensor], sizes: _SizeBinding) -> torch.Tensor:
    """Indices out of range read element 0 (the kernel reports them and the host raises);
    the rule's negative indices count from the end."""
    index_map, rule = node.attrs
    shape = sizes.shape(node)
    env = _grids(shape, dim_syms(node.shape))
    for k, values in enumerate(inputs[1:]):
        env[value_sym(k).name] = values.to(torch.int64).expand(shape)
    src = inputs[0]
    index = []
    for d, e in enumerate(index_map):
        i = _index_value(e, env, sizes)
        if any(s.extent is None for s in e.symbols()):
            size = src.shape[d]
            i = torch.as_tensor(i)
            if RULES[rule].wrap:
                i = torch.where(i < 0, i + size, i)
            i = torch.where((i < 0) | (i >= size), 0, i)
        index.append(i)
    return _take(src, index, shape, None, 0)


def _reduce(node: Node, inputs: list[torch.Tensor], sizes: _SizeBinding) -> torch.Tensor:
    kind, axes = node.attrs
    x = inputs[0]
    reduce_fn = _REDUCTIONS.get(kind)
    if reduce_fn is None:
        raise NotEvaluable(f"no evaluator for reduction {kind}")
    if not axes:
        return x
    return reduce_fn(x, tuple(axes))


def _moved_last(x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    """x with the reduced axes flattened into one last dimension."""
    kept = [d for d in range(x.dim()) if d not in axes]
    moved = x.permute(*kept, *axes)
    return moved.reshape(*[x.shape[d] for d in kept], -1)


def _prod(x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    return _moved_last(x, axes).prod(-1)


def _expsum(x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    """sum(exp(x - max x)), as the two passes it replaces compute it."""
    rows = _moved_last(x, axes)
    return (rows - rows.amax(-1, keepdim=True)).exp().sum(-1)


_REDUCTIONS: dict[str, Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor]] = {
    "sum": lambda x, axes: x.sum(dim=axes),
    "prod": _prod,
    "expsum": _expsum,
    "max": lambda x, axes: _moved_last(x, axes).amax(-1),
    "min": lambda x, axes: _moved_last(x, axes).amin(-1),
    "any": lambda x, axes: _moved_last(x, axes).any(-1),
    "all": lambda x, axes: _moved_last(x, axes).all(-1),
    "argmax": lambda x, axes: _moved_last(x, axes).argmax(-1),
    "argmin": lambda x, axes: _moved_last(x, axes).argmin(-1),
}

_MATMULS = ("aten.mm.default", "aten.addmm.default")


def _in_kernel_matmul(node: Node) -> bool:
    """A matmul a kernel computes itself (a matmul template, ir/matmul.py: alpha = beta = 1)."""
    return (node.op is Op.EXTERN and str(node.attrs[0]) in _MATMULS
            and all(node.attrs[2].get(k, 1) == 1 for k in ("alpha", "beta")))


def _matmul(node: Node, inputs: list[torch.Tensor], sizes: _SizeBinding) -> torch.Tensor:
    args = [inputs[a.index] for a in node.attrs[1]]
    product = torch.mm(args[-2], args[-1])
    return product + args[0] if len(args) == 3 else product


_EVALUATORS: dict[Op, Callable[[Node, list[torch.Tensor], _SizeBinding], torch.Tensor]] = {
    Op.CONSTANT: _constant,
    Op.IOTA: _iota,
    Op.POINTWISE: _pointwise,
    Op.VIEW: _view,
    Op.GATHER: _gather,
    Op.REDUCE: _reduce,
}

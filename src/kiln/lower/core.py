"""Constructors of level-1 nodes that lowerings share: broadcasting, type promotion,
views as index maps, element-wise functions and reductions."""

from __future__ import annotations

from typing import Sequence

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from kiln.ir import index as ix
from kiln.ir.index import Expr
from kiln.ir.ops import FLOAT_ONLY, POINTWISE_FNS, PREDICATES
from kiln.ir.sizes import (
    NeedsNumber,
    Size,
    as_size,
    is_symbolic,
    known_divides,
    known_eq,
    known_le,
    numel,
    smax,
    smin,
)
from kiln.ir.tensor import Builder, Node, Op, dim_syms


class Unsupported(Exception):
    """A lowering cannot handle this call; the op runs in ATen instead (reason = message)."""


Scalar = int | float | bool


# ----------------------------------------------------------------------------- scalars
def constant(b: Builder, value: Scalar | Node, dtype: torch.dtype, shape: tuple[int, ...] = ()) -> Node:
    if is_weak_scalar(value):  # a number read at run time
        return expand(b, cast(b, value, dtype), shape)
    if is_symbolic(value):  # a size of the shape family (a mean's count): known at run time
        if dtype is torch.bool:
            raise NeedsNumber(f"the truth of the size {value}")
        return b.make(Op.CONSTANT, (), (as_size(value),), shape, dtype)
    if dtype.is_floating_point:
        value = float(value)
    elif dtype is torch.bool:
        value = bool(value)
    else:
        value = int(value)
    return b.make(Op.CONSTANT, (), (value,), shape, dtype)


def promote(*args: Node | Scalar) -> torch.dtype:
    """PyTorch's type promotion: dimensioned tensors > 0-d tensors > Python scalars."""
    dummies = [_promotion_sample(a) for a in args]
    _, result = elementwise_dtypes(*dummies, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.NO_OPMATH)
    return result


# meta key of a node that stands for a Python number read at run time: it promotes as one
WEAK_SCALAR = "weak_scalar"


def is_weak_scalar(v: object) -> bool:
    return isinstance(v, Node) and bool(v.meta.get(WEAK_SCALAR))


def _promotion_sample(a: Node | Scalar) -> torch.Tensor | Scalar:
    if not isinstance(a, Node):
        return a
    if is_weak_scalar(a):  # a Python number: only its kind (bool, int, float) counts
        return True if a.dtype is torch.bool else 1.0 if a.dtype.is_floating_point else 1
    return torch.empty(() if a.shape == () else (0,), dtype=a.dtype)


# ----------------------------------------------------------------------------- views
def broadcast_shapes(*shapes: Sequence[Size]) -> tuple[Size, ...]:
    if not any(is_symbolic(s) for shape in shapes for s in shape):
        return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))
    ndim = max(len(s) for s in shapes)
    out: list[Size] = []
    for d in range(ndim):
        sizes = [shape[len(shape) - ndim + d] for shape in shapes if len(shape) - ndim + d >= 0]
        kept = [s for s in sizes if not (isinstance(s, int) and s == 1)]
        if not kept:
            out.append(1)
        elif all(known_eq(s, kept[0]) for s in kept):
            out.append(kept[0])
        else:  # Dynamo's guards make equal sizes one symbol: these may differ
            raise Unsupported(f"broadcast of sizes {sizes} that the shape family does not relate")
    return tuple(out)


def view(b: Builder, src: Node, index_map: Sequence[Expr], shape: Sequence[int],
         valid: tuple = (), fill: Scalar = 0) -> Node:
    """out[d] = src[index_map(d)]; composes with a view below it (views of views stay one map)."""
    shape = tuple(as_size(s) for s in shape)
    index_map = tuple(index_map)
    out_syms = dim_syms(shape)
    if not valid and index_map == tuple(ix.as_expr(s) for s in out_syms) and shape == src.shape:
        return src
    if src.op is Op.VIEW:
        inner_map, inner_valid, inner_fill = src.attrs
        if not inner_valid or not valid or inner_fill == fill:
            mapping = dict(zip(dim_syms(src.shape), index_map))
            composed = tuple(ix.substitute(e, mapping) for e in inner_map)
            inner_valid = tuple((ix.substitute(e, mapping), n) for e, n in inner_valid)
            fill = fill if valid else inner_fill
            return view(b, src.inputs[0], composed, shape, tuple(valid) + inner_valid, fill)
    if src.op is Op.CONSTANT and not valid:
        return b.make(Op.CONSTANT, (), src.attrs, shape, src.dtype)
    return b.make(Op.VIEW, (src,), (index_map, tuple(valid), fill), shape, src.dtype)


def expand(b: Builder, x: Node, shape: Sequence[Size]) -> Node:
    shape = tuple(as_size(s) for s in shape)
    if x.shape == shape:
        return x
    syms = dim_syms(shape)
    off = len(shape) - len(x.shape)
    for i, n in enumerate(x.shape):
        if not known_eq(n, shape[off + i]) and not (isinstance(n, int) and n == 1):
            raise Unsupported(f"expand of size {n} to {shape[off + i]}")
    index_map = [ix.as_expr(syms[off + i]) if known_eq(n, shape[off + i]) else ix.as_expr(0)
                 for i, n in enumerate(x.shape)]
    return view(b, x, index_map, shape)


def permute(b: Builder, x: Node, perm: Sequence[int]) -> Node:
    perm = [p % max(len(x.shape), 1) for p in perm]
    shape = tuple(x.shape[p] for p in perm)
    syms = dim_syms(shape)
    index_map: list[Expr] = [ix.as_expr(0)] * len(x.shape)
    for j, p in enumerate(perm):
        index_map[p] = ix.as_expr(syms[j])
    return view(b, x, index_map, shape)


def reshape(b: Builder, x: Node, shape: Sequence[Size]) -> Node:
    shape = list(as_size(s) for s in shape)
    if -1 in shape:
        known = numel(tuple(s for s in shape if s != -1))
        if is_symbolic(known) or is_symbolic(x.numel):
            shape[shape.index(-1)] = _exact_quotient(x.numel, known)
        else:
            shape[shape.index(-1)] = x.numel // known if known else 0
    shape = tuple(shape)
    if not known_eq(numel(shape), x.numel):
        raise Unsupported(f"reshape of {x.shape} to {shape} changes the element count")
    if shape == x.shape:
        return x
    if x.numel == 0:  # nothing is ever read: any index map will do
        return view(b, x, [ix.as_expr(0)] * len(x.shape), shape)
    out = dim_syms(shape)
    index_map: list[Expr] = [ix.as_expr(0)] * len(x.shape)
    # Walk both shapes in groups of equal element count: a split or a merge needs no
    # division across the whole tensor, only within its group.
    i = j = 0
    while i < len(x.shape) or j < len(shape):
        gi, gj = [i], [j]
        pi = x.shape[i] if i < len(x.shape) else 1
        pj = shape[j] if j < len(shape) else 1
        while not known_eq(pi, pj):
            if _smaller(pi, pj):
                i += 1
                gi.append(i)
                pi *= x.shape[i]
            else:
                j += 1
                gj.append(j)
                pj *= shape[j]
        gi = [k for k in gi if k < len(x.shape)]
        gj = [k for k in gj if k < len(shape)]
        linear = ix.as_expr(0)
        for k in gj:
            linear = linear * shape[k] + ix.as_expr(out[k])
        stride = 1
        for k in reversed(gi):
            index_map[k] = ix.mod(ix.floordiv(linear, stride), x.shape[k])
            stride *= x.shape[k]
        i, j = (gi[-1] + 1 if gi else i + 1), (gj[-1] + 1 if gj else j + 1)
        if pi == 0:  # empty tensors: nothing to index
            break
    return view(b, x, index_map, shape)


def _smaller(a: Size, b: Size) -> bool:
    """a < b, for the products of sizes a reshape's groups compare: where symbolic, the one
    that divides the other is the smaller (sizes of a family are at least 2)."""
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    if known_divides(a, b):
        return True
    if known_divides(b, a):
        return False
    raise NeedsNumber(f"a reshape compares the sizes {a} and {b}")


def _exact_quotient(n: Size, d: Size) -> Size:
    from kiln.ir.sizes import exact_div

    if not known_divides(d, n):
        raise NeedsNumber(f"a reshape divides {n} by {d}")
    return exact_div(n, d)


def slice_(b: Builder, x: Node, dim: int, start: int, end: int, step: int = 1) -> Node:
    dim %= len(x.shape)
    lo, length = slice_bounds(x.shape[dim], start, end, step)
    return _sliced(b, x, dim, lo, length, step)


def slice_bounds(n: Size, start, end, step: int) -> tuple[Size, Size]:
    """(first index, length) of the slice [start:end:step] of a dimension of size n."""
    if not (is_symbolic(n) or is_symbolic(start) or is_symbolic(end)):
        start, end, _ = slice(start, end, step).indices(n) if step > 0 else (start, end, step)
        return start, max(0, (end - start + step - 1) // step)
    return _symbolic_bounds(n, start, end, step)


def _symbolic_bounds(n: Size, start, end, step: int) -> tuple[Size, Size]:
    """A slice of a shape family's dimension: its bounds as sizes clamped to [0, n], as Max or
    Min of the size where the family's facts do not decide it. A bound that is itself a size
    not known to be non-negative (a start counted from the end, perhaps) needs a number."""
    from torch.utils._sympy.functions import FloorDiv

    def bound(v, default):
        if v is None:
            return default
        if isinstance(v, int) and v >= 2**62:  # x[a:] is traced as end = sys.maxsize
            return n
        if isinstance(v, int):  # counted from the end if negative, then clamped to [0, n], as Python does
            return smin(smax(v + n if v < 0 else v, 0), n)
        if known_le(0, v):
            return smin(v, n)
        raise NeedsNumber(f"a slice [{start}:{end}] of a dimension of size {n}")

    if not isinstance(step, int) or step <= 0:
        raise NeedsNumber(f"a slice with step {step} of a dimension of size {n}")
    lo, hi = bound(start, 0), bound(end, n)
    if not known_le(lo, hi):
        raise NeedsNumber(f"a slice [{start}:{end}] of a dimension of size {n}")
    length = as_size(hi - lo) if step == 1 else as_size(FloorDiv(hi - lo + step - 1, step))
    return lo, length


def slice_scatter(b: Builder, x: Node, src: Node, dim: int, start, end, step: int) -> Node:
    """x with src written over its slice [start:end:step] along dim (a slice's gradient): src
    placed by a view whose positions outside the slice are masked, chosen where inside."""
    dim %= len(x.shape)
    if step != 1:
        raise Unsupported(f"slice_scatter with step {step}")
    lo, length = slice_bounds(x.shape[dim], start, end, step)
    index_map = [ix.as_expr(s) for s in dim_syms(x.shape)]
    index_map[dim] = index_map[dim] - lo
    valid = ((index_map[dim], length),)
    placed = view(b, src, index_map, x.shape, valid, 0)
    inside = view(b, constant(b, True, torch.bool, src.shape), index_map, x.shape, valid, False)
    return pointwise(b, "where", inside, placed, x, out_dtype=x.dtype)


def _sliced(b: Builder, x: Node, dim: int, start, length, step: int) -> Node:
    shape = list(x.shape)
    shape[dim] = length
    syms = dim_syms(tuple(shape))
    index_map = [ix.as_expr(s) for s in syms]
    index_map[dim] = ix.as_expr(syms[dim]) * step + start
    return view(b, x, index_map, shape)


def select(b: Builder, x: Node, dim: int, index: int) -> Node:
    dim %= len(x.shape)
    index %= x.shape[dim]
    shape = x.shape[:dim] + x.shape[dim + 1:]
    syms = [ix.as_expr(s) for s in dim_syms(shape)]
    index_map = syms[:dim] + [ix.as_expr(index)] + syms[dim:]
    return view(b, x, index_map, shape)


def unsqueeze(b: Builder, x: Node, dim: int) -> Node:
    dim %= len(x.shape) + 1
    return reshape(b, x, x.shape[:dim] + (1,) + x.shape[dim:])


def squeeze(b: Builder, x: Node, dims: Sequence[int] | None) -> Node:
    if dims is None:
        dims = range(len(x.shape))
    dims = {d % max(len(x.shape), 1) for d in dims}
    shape = tuple(s for i, s in enumerate(x.shape) if not (i in dims and isinstance(s, int) and s == 1))
    return reshape(b, x, shape)


def pad(b: Builder, x: Node, pads: Sequence[int], fill: Scalar) -> Node:
    """constant_pad_nd: pads pairs (left, right) from the last dimension backwards."""
    shape = list(x.shape)
    lefts = [0] * len(shape)
    for k in range(len(pads) // 2):
        d = len(shape) - 1 - k
        left, right = pads[2 * k], pads[2 * k + 1]
        lefts[d] = left
        shape[d] = shape[d] + left + right
    if any(s < 0 for s in shape):
        raise Unsupported("padding removes more than the whole dimension")
    syms = dim_syms(tuple(shape))
    index_map = [ix.as_expr(s) - lefts[d] for d, s in enumerate(syms)]
    valid = tuple((e, x.shape[d]) for d, e in enumerate(index_map) if e.bounds() is None
                  or e.bounds()[0] < 0 or e.bounds()[1] >= x.shape[d])
    return view(b, x, index_map, shape, valid, fill)


# ----------------------------------------------------------------------------- math
def cast(b: Builder, x: Node, dtype: torch.dtype) -> Node:
    if x.dtype == dtype:
        return x
    if x.op is Op.CONSTANT:
        return constant(b, x.attrs[0], dtype, x.shape)
    return b.make(Op.POINTWISE, (x,), ("cast",), x.shape, dtype)


def as_node(b: Builder, v: Node | Scalar, dtype: torch.dtype) -> Node:
    return v if isinstance(v, Node) else constant(b, v, dtype)


def pointwise(b: Builder, fn: str, *args: Node | Scalar, out_dtype: torch.dtype | None = None) -> Node:
    """Broadcast, promote, apply fn. Comparisons return bool; FLOAT_ONLY fns promote ints."""
    spec = POINTWISE_FNS[fn]
    if len(args) != spec.arity:
        raise Unsupported(f"{fn} takes {spec.arity} operands, got {len(args)}")
    operands = args[1:] if fn == "where" else args
    compute = promote(*operands)
    if fn in FLOAT_ONLY and not (compute.is_floating_point or compute.is_complex):
        compute = torch.get_default_dtype()
    if compute.is_complex:
        raise Unsupported("complex tensors are not lowered")
    shape = broadcast_shapes(*[a.shape for a in args if isinstance(a, Node)] or [()])
    nodes = []
    for k, a in enumerate(args):
        dtype = torch.bool if (fn == "where" and k == 0) else compute
        if fn in ("logical_and", "logical_or", "logical_xor", "logical_not"):
            dtype = torch.bool
        if k == 1 and _keeps_scalar_precision(fn, a, compute):
            dtype = torch.float32
        n = cast(b, as_node(b, a, dtype), dtype)
        nodes.append(expand(b, n, shape))
    result_dtype = torch.bool if fn in PREDICATES else compute
    if fn in ("lshift", "rshift") and compute.is_floating_point:
        raise Unsupported("shift of floating-point values")
    out = b.make(Op.POINTWISE, tuple(nodes), (fn,), shape, result_dtype)
    return cast(b, out, out_dtype) if out_dtype is not None else out


# Eager multiplies and divides a low-precision tensor by a scalar operand (a Python number
# or a 0-d tensor) without first rounding the scalar to the tensor's dtype; other ops round it.
_OPMATH_SCALAR_FNS = frozenset({"mul", "div", "floordiv", "truncdiv"})


def _keeps_scalar_precision(fn: str, operand: Node | Scalar, compute: torch.dtype) -> bool:
    if fn not in _OPMATH_SCALAR_FNS or compute not in (torch.bfloat16, torch.float16):
        return False
    return not isinstance(operand, Node) or operand.shape == ()


def reduce(b: Builder, kind: str, x: Node, dims: Sequence[int] | None, keepdim: bool,
           out_dtype: torch.dtype) -> Node:
    ndim = len(x.shape)
    dims = list(range(ndim)) if dims is None or len(dims) == 0 else sorted({d % max(ndim, 1) for d in dims})
    if ndim == 0:
        dims = []
    if kind in ("sum", "prod") and x.dtype != out_dtype:
        x = cast(b, x, out_dtype)
    if kind in ("any", "all"):
        x = cast(b, x, torch.bool)
    shape = tuple(s for i, s in enumerate(x.shape) if i not in dims)
    if dims:
        out = b.make(Op.REDUCE, (x,), (kind, tuple(dims)), shape, out_dtype)
    elif kind in ("argmax", "argmin"):
        out = constant(b, 0, torch.int64, shape)
    else:
        out = cast(b, x, out_dtype)
    if keepdim:
        kept = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
        out = reshape(b, out, kept)
    return out

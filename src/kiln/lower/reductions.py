"""Reductions -> REDUCE nodes (mean and friends are sums scaled afterwards)."""

from __future__ import annotations

import math

import torch

from kiln.ir.sizes import NeedsNumber, is_symbolic, known_le, numel
from kiln.lower.context import LowerCtx
from kiln.lower.core import Unsupported, cast, constant, pointwise, reduce, slice_
from kiln.lower.registry import lowering

aten = torch.ops.aten


def _dims(x, dim):
    if dim is None:
        return None
    return [dim] if isinstance(dim, int) else list(dim)


def _count(x, dims) -> int:
    if dims is None or len(dims) == 0:
        return x.numel
    return numel(tuple(x.shape[d % len(x.shape)] for d in dims)) if x.shape else 1


@lowering(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx: LowerCtx, x, dim=None, keepdim=False, *, dtype=None):
    return reduce(ctx.b, "sum", x, _dims(x, dim), keepdim, ctx.out_dtype)


@lowering(aten.prod.dim_int, aten.prod.default)
def _prod(ctx: LowerCtx, x, dim=None, keepdim=False, *, dtype=None):
    return reduce(ctx.b, "prod", x, _dims(x, dim), keepdim, ctx.out_dtype)


@lowering(aten.mean.dim, aten.mean.default)
def _mean(ctx: LowerCtx, x, dim=None, keepdim=False, *, dtype=None):
    if not ctx.out_dtype.is_floating_point:
        raise Unsupported("mean of an integer tensor")
    acc = torch.float32 if ctx.out_dtype in (torch.bfloat16, torch.float16) else ctx.out_dtype
    total = reduce(ctx.b, "sum", x, _dims(x, dim), keepdim, acc)
    n = _count(x, _dims(x, dim))
    count = constant(ctx.b, n, acc) if is_symbolic(n) else float(n)  # a family's count: a size
    return pointwise(ctx.b, "div", total, count, out_dtype=ctx.out_dtype)


@lowering(aten.amax.default, aten.max.default)
def _amax(ctx: LowerCtx, x, dim=(), keepdim=False):
    return reduce(ctx.b, "max", x, _dims(x, dim), keepdim, ctx.out_dtype)


@lowering(aten.amin.default, aten.min.default)
def _amin(ctx: LowerCtx, x, dim=(), keepdim=False):
    return reduce(ctx.b, "min", x, _dims(x, dim), keepdim, ctx.out_dtype)


@lowering(aten.argmax.default)
def _argmax(ctx: LowerCtx, x, dim=None, keepdim=False):
    return reduce(ctx.b, "argmax", x, _dims(x, dim), keepdim, torch.int64)


@lowering(aten.argmin.default)
def _argmin(ctx: LowerCtx, x, dim=None, keepdim=False):
    return reduce(ctx.b, "argmin", x, _dims(x, dim), keepdim, torch.int64)


@lowering(aten.max.dim)
def _max_dim(ctx: LowerCtx, x, dim, keepdim=False):
    values = reduce(ctx.b, "max", x, [dim], keepdim, x.dtype)
    return values, reduce(ctx.b, "argmax", x, [dim], keepdim, torch.int64)


@lowering(aten.min.dim)
def _min_dim(ctx: LowerCtx, x, dim, keepdim=False):
    values = reduce(ctx.b, "min", x, [dim], keepdim, x.dtype)
    return values, reduce(ctx.b, "argmin", x, [dim], keepdim, torch.int64)


@lowering(aten.any.default, aten.any.dim, aten.any.dims)
def _any(ctx: LowerCtx, x, dim=None, keepdim=False):
    return reduce(ctx.b, "any", x, _dims(x, dim), keepdim, torch.bool)


@lowering(aten.all.default, aten.all.dim, aten.all.dims)
def _all(ctx: LowerCtx, x, dim=None, keepdim=False):
    return reduce(ctx.b, "all", x, _dims(x, dim), keepdim, torch.bool)


def _shifted_mean(ctx: LowerCtx, xf, dims, n: int, acc: torch.dtype):
    """mean = ref + sum(x - ref) / n, ref being the row's first value (keepdim shape).

    A row of equal values then has exactly ref as its mean and exactly 0 as its deviations,
    whatever the summation order (eager's layer_norm/group_norm give 0 there; rsqrt(var + eps)
    would amplify a one-ulp error of sum / n)."""
    ndim = len(xf.shape)
    reduced = list(range(ndim)) if dims is None or len(dims) == 0 else [d % ndim for d in dims]
    if n == 0 or ndim == 0:
        return pointwise(ctx.b, "div", reduce(ctx.b, "sum", xf, dims, True, acc), _number(ctx, n, acc))
    ref = xf
    for d in reduced:
        ref = slice_(ctx.b, ref, d, 0, 1)
    shifted = reduce(ctx.b, "sum", pointwise(ctx.b, "sub", xf, ref), dims, True, acc)
    return pointwise(ctx.b, "add", ref, pointwise(ctx.b, "div", shifted, _number(ctx, n, acc)))


def _number(ctx: LowerCtx, n, dtype: torch.dtype):
    """A count as an operand: a float, or for a shape family's size a constant node of it."""
    return constant(ctx.b, n, dtype) if is_symbolic(n) else float(n)


def _var(ctx: LowerCtx, x, dim, correction, keepdim):
    """Two passes over the row (mean, then squared deviations): exact like eager's."""
    if not x.dtype.is_floating_point:
        raise Unsupported("variance of an integer tensor")
    dims = _dims(x, dim)
    acc = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    xf = cast(ctx.b, x, acc)
    n = _count(x, dims)
    mean = _shifted_mean(ctx, xf, dims, n, acc)
    dev = pointwise(ctx.b, "sub", xf, mean)
    sq = reduce(ctx.b, "sum", pointwise(ctx.b, "mul", dev, dev), dims, keepdim, acc)
    correction = 1 if correction is None else correction
    if is_symbolic(n):  # a family's count: the divisor is positive where the size exceeds it
        if not known_le(correction, n):
            raise NeedsNumber(f"variance with correction {correction} over {n} elements")
        var = pointwise(ctx.b, "div", sq, _number(ctx, n - correction, acc))
    else:
        var = pointwise(ctx.b, "div", sq, float(max(n - correction, 0)))
    mean_out = mean if keepdim else reduce_keepdim_drop(ctx, mean, dims, x)
    return var, mean_out


def reduce_keepdim_drop(ctx: LowerCtx, mean, dims, x):
    from kiln.lower.core import squeeze

    ndim = len(x.shape)
    dims = list(range(ndim)) if not dims else [d % ndim for d in dims]
    return squeeze(ctx.b, mean, dims)


@lowering(aten.var.correction)
def _var_correction(ctx: LowerCtx, x, dim=None, *, correction=None, keepdim=False):
    var, _ = _var(ctx, x, dim, correction, keepdim)
    return cast(ctx.b, var, ctx.out_dtype)


@lowering(aten.var_mean.correction)
def _var_mean(ctx: LowerCtx, x, dim=None, *, correction=None, keepdim=False):
    var, mean = _var(ctx, x, dim, correction, keepdim)
    return cast(ctx.b, var, x.dtype), cast(ctx.b, mean, x.dtype)


@lowering(aten.std.correction)
def _std(ctx: LowerCtx, x, dim=None, *, correction=None, keepdim=False):
    var, _ = _var(ctx, x, dim, correction, keepdim)
    return pointwise(ctx.b, "sqrt", var, out_dtype=ctx.out_dtype)


@lowering(aten.linalg_vector_norm.default)
def _vector_norm(ctx: LowerCtx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """linalg.vector_norm as eager's kernel computes it: the square root of a sum of squares
    (ord 2), a sum of magnitudes (1), the largest or smallest magnitude (inf, -inf), a count
    of nonzeros (0), (sum |x|^p)^(1/p) for any other p; sums in float32 for low-precision
    inputs. Over dims of size 1 it is |x| exactly (no power and root to round)."""
    if not x.dtype.is_floating_point:
        raise Unsupported("vector norm of a non-float tensor")
    dims = _dims(x, dim) or None  # [] reduces every dim
    ord = float(ord)
    if ord == 0:
        return reduce(ctx.b, "sum", pointwise(ctx.b, "ne", x, 0.0), dims, keepdim, ctx.out_dtype)
    if abs(ord) == math.inf:
        magnitude = pointwise(ctx.b, "abs", x)
        kind = "max" if ord > 0 else "min"
        return cast(ctx.b, reduce(ctx.b, kind, magnitude, dims, keepdim, x.dtype), ctx.out_dtype)
    acc = dtype or x.dtype
    acc = torch.float32 if acc in (torch.bfloat16, torch.float16) else acc
    magnitude = pointwise(ctx.b, "abs", cast(ctx.b, x, acc))
    reduced = range(len(x.shape)) if dims is None or not x.shape else dims
    if ord == 1 or all(x.shape[d] == 1 for d in reduced):
        total = reduce(ctx.b, "sum", magnitude, dims, keepdim, acc)
    elif ord == 2:
        total = pointwise(ctx.b, "sqrt", reduce(ctx.b, "sum", pointwise(ctx.b, "mul", magnitude, magnitude),
                                                dims, keepdim, acc))
    else:
        powers = pointwise(ctx.b, "pow", magnitude, ord)
        total = pointwise(ctx.b, "pow", reduce(ctx.b, "sum", powers, dims, keepdim, acc), 1.0 / ord)
    return cast(ctx.b, total, ctx.out_dtype)

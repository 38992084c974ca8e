"""Element-wise ATen ops -> POINTWISE nodes."""

from __future__ import annotations

import math

import torch

from kiln.ir.sizes import as_size
from kiln.ir.tensor import Node, Op
from kiln.lower.context import LowerCtx
from kiln.lower.core import Unsupported, cast, constant, pointwise, promote
from kiln.lower.registry import lowering
from kiln.passes.layout import REQUESTED_STRIDES, same_strides

aten = torch.ops.aten

_UNARY = {
    aten.neg: "neg", aten.abs: "abs", aten.exp: "exp", aten.exp2: "exp2", aten.log: "log",
    aten.log2: "log2", aten.log10: "log10", aten.log1p: "log1p", aten.expm1: "expm1",
    aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.reciprocal: "reciprocal", aten.sin: "sin",
    aten.cos: "cos", aten.tan: "tan", aten.asin: "asin", aten.acos: "acos", aten.atan: "atan",
    aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh", aten.asinh: "asinh",
    aten.acosh: "acosh", aten.atanh: "atanh", aten.erf: "erf", aten.erfc: "erfc",
    aten.sigmoid: "sigmoid", aten.sign: "sign", aten.sgn: "sign", aten.isnan: "isnan",
    aten.logical_not: "logical_not", aten.bitwise_not: "bitwise_not",
}

_BINARY = {
    aten.mul: "mul", aten.maximum: "maximum", aten.minimum: "minimum", aten.atan2: "atan2",
    aten.copysign: "copysign", aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le",
    aten.gt: "gt", aten.ge: "ge", aten.logical_and: "logical_and", aten.logical_or: "logical_or",
    aten.logical_xor: "logical_xor", aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or",
    aten.bitwise_xor: "bitwise_xor", aten.remainder: "remainder", aten.fmod: "fmod",
    aten.bitwise_left_shift: "lshift", aten.bitwise_right_shift: "rshift",
    aten.__lshift__: "lshift", aten.__rshift__: "rshift",
}


def _register_unary(target, fn: str) -> None:
    @lowering(target.default)
    def lower(ctx: LowerCtx, x):
        return pointwise(ctx.b, fn, x, out_dtype=ctx.out_dtype)


def _register_binary(target, fn: str) -> None:
    @lowering(target)
    def lower(ctx: LowerCtx, a, b):
        return pointwise(ctx.b, fn, a, b, out_dtype=ctx.out_dtype)


for _t, _f in _UNARY.items():
    _register_unary(_t, _f)
for _t, _f in _BINARY.items():
    _register_binary(_t, _f)


@lowering(aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default)
def _rounding(ctx: LowerCtx, x):
    if not x.dtype.is_floating_point:
        return x  # integers are already whole
    name = ctx.target.overloadpacket.__name__
    return pointwise(ctx.b, name, x, out_dtype=ctx.out_dtype)


@lowering(aten.gelu.default)
def _gelu(ctx: LowerCtx, x, approximate="none"):
    if approximate != "none":  # the decomposition table keeps only the erf form whole
        raise Unsupported(f"gelu(approximate={approximate!r})")
    return pointwise(ctx.b, "gelu", x, out_dtype=ctx.out_dtype)


@lowering(aten.isinf.default)
def _isinf(ctx: LowerCtx, x):
    if not x.dtype.is_floating_point:
        return constant(ctx.b, False, torch.bool, x.shape)
    return pointwise(ctx.b, "isinf", x)


@lowering(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add_sub(ctx: LowerCtx, a, b, alpha=1):
    fn = "add" if ctx.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    if fn == "sub" and a is not None and getattr(a, "dtype", None) is torch.bool:
        raise Unsupported("subtraction of bool tensors")
    return _plus_scaled(ctx, fn, a, b, alpha)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx: LowerCtx, a, b, alpha=1):
    return _plus_scaled(ctx, "sub", b, a, alpha)


def _plus_scaled(ctx: LowerCtx, fn: str, a, b, alpha):
    """a + alpha * b (or a - alpha * b). Eager converts alpha to the operands' dtype first (on
    bool, -1 is True). For a low-precision result eager rounds the scalars to its dtype,
    computes in float32 and rounds once (not alpha * b on its own)."""
    if promote(a, b) is torch.bool:
        alpha = bool(alpha)
    if alpha == 1:
        return pointwise(ctx.b, fn, a, b, out_dtype=ctx.out_dtype)
    low = ctx.out_dtype
    if low in (torch.bfloat16, torch.float16):
        a, b = (cast(ctx.b, v, torch.float32) if isinstance(v, Node) else _rounded(v, low) for v in (a, b))
        alpha = _rounded(alpha, low)
    return pointwise(ctx.b, fn, a, pointwise(ctx.b, "mul", b, alpha), out_dtype=ctx.out_dtype)


def _rounded(value, dtype: torch.dtype):
    return torch.tensor(value, dtype=dtype).item()


# true_divide: what Dynamo's float arithmetic on a shape family's scalars becomes
@lowering(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor, aten.true_divide.Scalar)
def _div(ctx: LowerCtx, a, b):
    return pointwise(ctx.b, "div", a, b, out_dtype=ctx.out_dtype)


@lowering(aten.square.default)
def _square(ctx: LowerCtx, x):
    if x.dtype is torch.bool:
        raise Unsupported("square of a bool tensor (eager promotes it to int64)")
    return pointwise(ctx.b, "mul", x, x, out_dtype=ctx.out_dtype)


@lowering(aten.round.decimals)
def _round_decimals(ctx: LowerCtx, x, *, decimals=0):
    """As eager: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d for d < 0, in the
    float type eager computes in (float32 for 16-bit floats), rounded to x's dtype once."""
    if not x.dtype.is_floating_point:
        return x
    if decimals == 0:
        return pointwise(ctx.b, "round", x, out_dtype=ctx.out_dtype)
    math_dtype = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    scale = 10.0 ** abs(decimals)
    shift, unshift = ("mul", "div") if decimals > 0 else ("div", "mul")
    wide = cast(ctx.b, x, math_dtype)
    rounded = pointwise(ctx.b, "round", pointwise(ctx.b, shift, wide, scale, out_dtype=math_dtype),
                        out_dtype=math_dtype)
    return cast(ctx.b, pointwise(ctx.b, unshift, rounded, scale, out_dtype=math_dtype), ctx.out_dtype)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx: LowerCtx, a, b, *, rounding_mode=None):
    fn = {None: "div", "floor": "floordiv", "trunc": "truncdiv"}[rounding_mode]
    return pointwise(ctx.b, fn, a, b, out_dtype=ctx.out_dtype)


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(ctx: LowerCtx, a, b):
    return pointwise(ctx.b, "floordiv", a, b, out_dtype=ctx.out_dtype)


@lowering(aten.pow.Tensor_Scalar)
def _pow_scalar(ctx: LowerCtx, x, exponent):
    if exponent == 2:
        return pointwise(ctx.b, "mul", x, x, out_dtype=ctx.out_dtype)
    if exponent == 1:
        return cast(ctx.b, x, ctx.out_dtype)
    if exponent == 0.5 and x.dtype.is_floating_point:
        return pointwise(ctx.b, "sqrt", x, out_dtype=ctx.out_dtype)
    if exponent == 3 and x.dtype.is_floating_point:
        # ATen's special case, x * x * x: its bfloat16 kernel rounds each product, its
        # float16 one computes in float32 and rounds once
        if x.dtype is torch.float16:
            x = cast(ctx.b, x, torch.float32)
        return pointwise(ctx.b, "mul", pointwise(ctx.b, "mul", x, x), x, out_dtype=ctx.out_dtype)
    return pointwise(ctx.b, "pow", x, exponent, out_dtype=ctx.out_dtype)


@lowering(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(ctx: LowerCtx, a, b):
    return pointwise(ctx.b, "pow", a, b, out_dtype=ctx.out_dtype)


@lowering(aten.relu.default)
def _relu(ctx: LowerCtx, x):
    return pointwise(ctx.b, "maximum", x, constant(ctx.b, 0, x.dtype), out_dtype=ctx.out_dtype)


@lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx: LowerCtx, x, min=None, max=None):
    out = x
    if min is not None:
        out = pointwise(ctx.b, "maximum", out, min)
    if max is not None:
        out = pointwise(ctx.b, "minimum", out, max)
    return cast(ctx.b, out, ctx.out_dtype)


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(ctx: LowerCtx, x, min):
    return pointwise(ctx.b, "maximum", x, min, out_dtype=ctx.out_dtype)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(ctx: LowerCtx, x, max):
    return pointwise(ctx.b, "minimum", x, max, out_dtype=ctx.out_dtype)


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx: LowerCtx, cond, a, b):
    return pointwise(ctx.b, "where", cond, a, b, out_dtype=ctx.out_dtype)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx: LowerCtx, x, mask, value):
    value = value if not hasattr(value, "op") else cast(ctx.b, value, x.dtype)
    return pointwise(ctx.b, "where", mask, value, x, out_dtype=ctx.out_dtype)


@lowering(aten._to_copy.default)
def _to_copy(ctx: LowerCtx, x, *, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    if device is not None and not ctx.result_on_graph_device():
        raise Unsupported("copy to another device")
    return _in_memory_format(ctx, cast(ctx.b, x, dtype or x.dtype), x, memory_format)


@lowering(aten.clone.default)
def _clone(ctx: LowerCtx, x, *, memory_format=None):
    return _in_memory_format(ctx, x, x, memory_format)


def _in_memory_format(ctx: LowerCtx, value: Node, x: Node, memory_format) -> Node:
    """value, as a copy that asks for eager's strides where the program changes the memory
    format (x.contiguous(memory_format=torch.channels_last)): the layout pass gives that copy
    the strides asked for, so that one kernel converts and its readers (a convolution) get
    the layout they were written for. Elsewhere the value itself, in whatever layout it has."""
    val = ctx.fx_node.meta.get("val") if ctx.fx_node is not None else None
    src = ctx.arg_val(0)
    if memory_format in (None, torch.preserve_format) or val is None or src is None:
        return value
    shape, stride = tuple(map(as_size, val.shape)), tuple(map(as_size, val.stride()))
    if same_strides(shape, stride, tuple(map(as_size, src.stride()))):
        return value
    return ctx.b.make(Op.POINTWISE, (value,), ("cast",), value.shape, value.dtype,
                      meta={REQUESTED_STRIDES: stride})


@lowering(aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default)
def _identity(ctx: LowerCtx, x):
    return x


@lowering(torch.ops.prims.convert_element_type.default)
def _convert_element_type(ctx: LowerCtx, x, dtype):
    return cast(ctx.b, x, dtype)


# dtypes a non-finite float has no value in (eager's conversion is undefined there)
_INTEGER_TARGETS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


@lowering(aten.copy.default)
def _copy(ctx: LowerCtx, dst, src, non_blocking=False):
    """The functional copy: src's values (a tensor's or a Python number's), in dst's shape and dtype."""
    from kiln.lower.core import expand

    if not isinstance(src, Node):
        if isinstance(src, float) and not math.isfinite(src) and dst.dtype in _INTEGER_TARGETS:
            raise Unsupported("copy of a non-finite number into an integer tensor")
        return constant(ctx.b, src, dst.dtype, dst.shape)
    return cast(ctx.b, expand(ctx.b, src, dst.shape), dst.dtype)


# prims.fma exists once something registers it (Inductor's prims, which some decompositions
# produce): a graph can hold it only then
_FMA = getattr(torch.ops.prims, "fma", None)


@lowering(*([_FMA.default] if _FMA is not None else []))
def _fma(ctx: LowerCtx, a, b, c):
    return pointwise(ctx.b, "add", pointwise(ctx.b, "mul", a, b), c, out_dtype=ctx.out_dtype)

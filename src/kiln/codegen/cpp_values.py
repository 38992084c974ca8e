"""C types, literals and one computed value in C++: the op table cpp.py's kernels render from.

bf16 and f16 values are computed in float (f16 as _Float16) and rounded after each op where
eager rounds them.
"""

from __future__ import annotations

import torch

from kiln.codegen import base
from kiln.ir import kernel as k
from kiln.ir.index import Expr
from kiln.ir.kernel import compute_dtype
from kiln.ir.sizes import is_symbolic
from kiln.ir.sizes import render as sc

STORAGE_TYPE = {
    torch.float32: "float", torch.float64: "double", torch.bfloat16: "uint16_t",
    torch.float16: "_Float16", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "uint8_t",
}
# bool tensors are read as bytes and compared with 0: loads of C++ bool block vectorization.
COMPUTE_TYPE = {**STORAGE_TYPE, torch.bool: "bool"}


class CppUnsupported(Exception):
    pass


def ctype(dtype: torch.dtype) -> str:
    """The C type a value of this dtype is computed in."""
    dtype = compute_dtype(dtype)
    if dtype not in COMPUTE_TYPE:
        raise CppUnsupported(f"dtype {dtype} has no C++ type")
    return COMPUTE_TYPE[dtype]


def render_index(e: Expr) -> str:
    return base.render_index(e, "/", sc)


def size_params(kern: k.Kernel) -> str:
    """The kernel's size parameters (ks0, ks1, ...), after its buffers."""
    return "".join(f", const int64_t ks{i}" for i in range(len(kern.sizes)))


def literal(value, dtype: torch.dtype) -> str:
    if is_symbolic(value):  # a size of the shape family (a mean's count)
        return f"(({ctype(dtype)})({sc(value)}))"
    value = base.held_value(value, dtype)
    dtype = compute_dtype(dtype)
    if dtype is torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        if v != v:
            text = "std::numeric_limits<double>::quiet_NaN()"
        elif v in (float("inf"), float("-inf")):
            text = ("-" if v < 0 else "") + "std::numeric_limits<double>::infinity()"
        else:
            text = repr(v)
        return f"({ctype(dtype)})({text})"
    return f"(({ctype(dtype)}){int(value)}LL)" if abs(int(value)) < 2**63 else "0"


def round_to(expr: str, dtype: torch.dtype) -> str:
    if dtype is torch.bfloat16:
        return f"kiln_round_bf16({expr})"
    if dtype is torch.float16:
        return f"kiln_round_f16({expr})"
    return expr


def render_compute(s: k.Compute, arg_types: list[torch.dtype]) -> str:
    # bf16/f16 results are rounded after each op, as eager rounds them: skipping it would
    # let a tiny difference flip a comparison, a floor or a cast to int
    expr = _render_compute(s, arg_types)
    return round_to(expr, s.dtype) if k.rounds_result(s) else expr


def _render_compute(s: k.Compute, arg_types: list[torch.dtype]) -> str:
    t = compute_dtype(arg_types[0]) if arg_types else compute_dtype(s.dtype)
    text = base.render_op(_OPS, s, t, arg_types)
    if text is None:
        raise CppUnsupported(f"no C++ rendering of {s.fn} on {t}")
    return text


def _cast(a, c: base.OpContext) -> str:
    src, dst = c.arg_types[0], c.out
    if dst is torch.bool:
        return f"({a[0]} != 0)"
    if dst in (torch.bfloat16, torch.float16):
        return round_to(f"(float){a[0]}", dst)
    if dst is torch.uint8 and src.is_floating_point:  # through int64, as eager converts
        return f"(({ctype(dst)})(int64_t){a[0]})"
    return f"(({ctype(dst)}){a[0]})"


def _float_fn(name: str, otherwise: base.Rule | None = None) -> base.Rule:
    """name(a) on float (libm's float function), its double form (no trailing f) on double;
    otherwise on other types."""
    return base.on_fp(lambda a, c: f"{name if c.t is torch.float32 else name[:-1]}({a[0]})", otherwise)


def _on_bool(value: base.Rule, otherwise: base.Rule) -> base.Rule:
    return lambda a, c: value(a, c) if c.t is torch.bool else otherwise(a, c)


_FLOAT_FN = {  # name -> libm's function for float
    "exp": "expf", "exp2": "exp2f", "log": "logf", "log2": "log2f", "log10": "log10f",
    "log1p": "log1pf", "expm1": "expm1f", "sqrt": "sqrtf", "sin": "sinf", "cos": "cosf",
    "tan": "tanf", "asin": "asinf", "acos": "acosf", "atan": "atanf", "sinh": "sinhf",
    "cosh": "coshf", "tanh": "tanhf", "asinh": "asinhf", "acosh": "acoshf", "atanh": "atanhf",
    "erf": "erff", "erfc": "erfcf",
}
_OPS: dict[str, base.Rule] = {
    "cast": _cast,
    **{fn: base.infix(op) for fn, op in {**base.INFIX, "div": "/"}.items()},
    "add": base.infix("+", "||"),
    "mul": base.infix("*", "&&"),
    **{fn: _float_fn(name) for fn, name in _FLOAT_FN.items()},
    "abs": _float_fn("fabsf", _on_bool(base.first_arg, lambda a, c: f"({a[0]} < 0 ? -{a[0]} : {a[0]})")),
    # on integers, rounding is the identity
    "floor": _float_fn("floorf", base.first_arg),
    "ceil": _float_fn("ceilf", base.first_arg),
    "round": _float_fn("nearbyintf", base.first_arg),
    "trunc": _float_fn("truncf", base.first_arg),
    "neg": lambda a, c: f"(-{a[0]})",
    "rsqrt": lambda a, c: f"(({ctype(c.t)})1 / std::sqrt({a[0]}))",
    "reciprocal": lambda a, c: f"(({ctype(c.t)})1 / {a[0]})",
    "sigmoid": lambda a, c: f"kiln_sigmoid({a[0]})",
    "gelu": lambda a, c: f"kiln_gelu({a[0]})",
    "sign": _on_bool(base.first_arg, lambda a, c: f"kiln_sign({a[0]})"),
    "isnan": lambda a, c: f"({a[0]} != {a[0]})",
    "isinf": lambda a, c: f"std::isinf({a[0]})",
    "logical_not": lambda a, c: f"(!{a[0]})",
    "bitwise_not": _on_bool(lambda a, c: f"(!{a[0]})", lambda a, c: f"(~{a[0]})"),
    "logical_and": lambda a, c: f"((bool){a[0]} && (bool){a[1]})",
    "logical_or": lambda a, c: f"((bool){a[0]} || (bool){a[1]})",
    "logical_xor": lambda a, c: f"((bool){a[0]} != (bool){a[1]})",
    "maximum": _on_bool(base.infix("||"), lambda a, c: f"kiln_maximum<{ctype(c.t)}>({a[0]}, {a[1]})"),
    "minimum": _on_bool(base.infix("&&"), lambda a, c: f"kiln_minimum<{ctype(c.t)}>({a[0]}, {a[1]})"),
    "where": lambda a, c: f"({a[0]} ? {a[1]} : {a[2]})",
    "lshift": lambda a, c: None if c.fp else f"kiln_lshift<{ctype(c.t)}>({a[0]}, {a[1]})",
    "rshift": lambda a, c: None if c.fp else f"kiln_rshift<{ctype(c.t)}>({a[0]}, {a[1]})",
    "floordiv": base.on_fp(lambda a, c: f"kiln_floordiv_fp<{ctype(c.t)}>({a[0]}, {a[1]})",
                           lambda a, c: f"kiln_floordiv({a[0]}, {a[1]})"),
    "truncdiv": base.on_fp(lambda a, c: f"std::trunc({_round_like(f'{a[0]} / {a[1]}', c.arg_types)})",
                           lambda a, c: f"kiln_truncdiv({a[0]}, {a[1]})"),
    "remainder": base.on_fp(lambda a, c: f"kiln_remainder_fp<{ctype(c.t)}>({a[0]}, {a[1]})",
                            lambda a, c: f"kiln_remainder({a[0]}, {a[1]})"),
    "fmod": base.on_fp(lambda a, c: f"std::fmod({a[0]}, {a[1]})", lambda a, c: f"kiln_fmod({a[0]}, {a[1]})"),
    # powf, not std::pow, on float: it has a SIMD variant
    "pow": base.on_fp(lambda a, c: f"{'powf' if c.t is torch.float32 else 'pow'}({a[0]}, {a[1]})",
                      lambda a, c: f"kiln_pow({a[0]}, {a[1]})"),
    "atan2": lambda a, c: f"std::atan2({a[0]}, {a[1]})",
    "copysign": lambda a, c: f"std::copysign({a[0]}, {a[1]})",
    # (seed, offset): the prelude's Philox
    "philox_uniform": lambda a, c: f"kiln_philox_uniform({a[0]}, {a[1]})",
    "philox_normal": lambda a, c: f"kiln_philox_normal({a[0]}, {a[1]})",
}


def _round_like(expr: str, arg_types: list[torch.dtype]) -> str:
    """expr rounded to the operands' dtype when all are bf16 (or all f16): eager rounds there."""
    if arg_types and all(t is torch.bfloat16 for t in arg_types):
        return f"kiln_round_bf16({expr})"
    if arg_types and all(t is torch.float16 for t in arg_types):
        return f"kiln_round_f16({expr})"
    return f"({expr})"

"""The element-wise functions kiln's IRs know, shared by both IR levels and all backends.

Each entry says how many operands the function takes and how to evaluate it with torch,
which constant folding uses so that a folded value is exactly what eager would compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kiln.ir import philox


@dataclass(frozen=True)
class PointwiseFn:
    name: str
    arity: int
    eval: Callable[..., torch.Tensor]


def _floordiv(a, b):
    return torch.div(a, b, rounding_mode="floor")


def _truncdiv(a, b):
    return torch.div(a, b, rounding_mode="trunc")


_TABLE = [
    # unary
    ("neg", 1, torch.neg),
    ("abs", 1, torch.abs),
    ("exp", 1, torch.exp),
    ("exp2", 1, torch.exp2),
    ("log", 1, torch.log),
    ("log2", 1, torch.log2),
    ("log10", 1, torch.log10),
    ("log1p", 1, torch.log1p),
    ("expm1", 1, torch.expm1),
    ("sqrt", 1, torch.sqrt),
    ("rsqrt", 1, torch.rsqrt),
    ("reciprocal", 1, torch.reciprocal),
    ("sin", 1, torch.sin),
    ("cos", 1, torch.cos),
    ("tan", 1, torch.tan),
    ("asin", 1, torch.asin),
    ("acos", 1, torch.acos),
    ("atan", 1, torch.atan),
    ("sinh", 1, torch.sinh),
    ("cosh", 1, torch.cosh),
    ("tanh", 1, torch.tanh),
    ("asinh", 1, torch.asinh),
    ("acosh", 1, torch.acosh),
    ("atanh", 1, torch.atanh),
    ("erf", 1, torch.erf),
    ("erfc", 1, torch.erfc),
    ("sigmoid", 1, torch.sigmoid),
    ("gelu", 1, torch.nn.functional.gelu),  # the erf form
    ("floor", 1, torch.floor),
    ("ceil", 1, torch.ceil),
    ("round", 1, torch.round),
    ("trunc", 1, torch.trunc),
    ("sign", 1, torch.sign),
    ("isnan", 1, torch.isnan),
    ("isinf", 1, torch.isinf),
    ("logical_not", 1, torch.logical_not),
    ("bitwise_not", 1, torch.bitwise_not),
    ("cast", 1, lambda a: a),  # the target dtype is the node's dtype
    # binary
    ("add", 2, torch.add),
    ("sub", 2, torch.sub),
    ("mul", 2, torch.mul),
    ("div", 2, torch.div),
    ("floordiv", 2, _floordiv),
    ("truncdiv", 2, _truncdiv),
    ("remainder", 2, torch.remainder),
    ("fmod", 2, torch.fmod),
    ("pow", 2, torch.pow),
    ("maximum", 2, torch.maximum),
    ("minimum", 2, torch.minimum),
    ("atan2", 2, torch.atan2),
    ("copysign", 2, torch.copysign),
    ("eq", 2, torch.eq),
    ("ne", 2, torch.ne),
    ("lt", 2, torch.lt),
    ("le", 2, torch.le),
    ("gt", 2, torch.gt),
    ("ge", 2, torch.ge),
    ("logical_and", 2, torch.logical_and),
    ("logical_or", 2, torch.logical_or),
    ("logical_xor", 2, torch.logical_xor),
    ("bitwise_and", 2, torch.bitwise_and),
    ("bitwise_or", 2, torch.bitwise_or),
    ("bitwise_xor", 2, torch.bitwise_xor),
    ("lshift", 2, torch.bitwise_left_shift),
    ("rshift", 2, torch.bitwise_right_shift),
    # ternary
    ("where", 3, torch.where),
    # random: (seed, offset) -> float32, Philox4x32-10 (ir/philox.py)
    ("philox_uniform", 2, philox.uniform),
    ("philox_normal", 2, philox.normal),
]

POINTWISE_FNS: dict[str, PointwiseFn] = {n: PointwiseFn(n, a, f) for n, a, f in _TABLE}

COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
PREDICATES = COMPARISONS | {"isnan", "isinf", "logical_not", "logical_and", "logical_or", "logical_xor"}
# Functions that always compute in floating point (integers are promoted first).
# Functions from the math library: a kernel's vector loop and its scalar tail may give results
# an ulp apart, so two kernels computing one of them can disagree on an element.
LIBRARY_MATH = frozenset(
    "exp exp2 log log2 log10 log1p expm1 sin cos tan asin acos atan sinh cosh tanh asinh acosh "
    "atanh erf erfc sigmoid gelu pow atan2 philox_normal".split()
)
FLOAT_ONLY = frozenset(
    "exp exp2 log log2 log10 log1p expm1 sqrt rsqrt reciprocal sin cos tan asin acos atan "
    "sinh cosh tanh asinh acosh atanh erf erfc sigmoid gelu div atan2 copysign".split()
)


"""What both code generators render alike: index expressions, the value a constant of a
dtype holds, the infix operators, and the per-op tables element-wise ops are rendered from.

An op table maps an op's name to a rule: a function of the op's arguments (already rendered)
and an OpContext, returning its text, or None where the rule does not cover those types (the
renderer then says it has no rendering). A new element-wise op is one row per backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kiln.ir import kernel as k
from kiln.ir.index import Expr, FloorDiv, Sym

# operators that read the same in C++ and Triton (each backend adds its own)
INFIX = {"add": "+", "sub": "-", "mul": "*", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
         "gt": ">", "ge": ">=", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}


def render_index(e: Expr, floordiv: str, size: Callable[[object], str]) -> str:
    """An index expression: floordiv is the language's integer division of non-negative
    values, size renders a coefficient, divisor or constant (a shape family's symbol too)."""
    parts = []
    for atom, coef in e.terms:
        if isinstance(atom, Sym):
            text = atom.name
        else:
            op = floordiv if isinstance(atom, FloorDiv) else "%"
            text = f"(({render_index(atom.arg, floordiv, size)}) {op} {size(atom.divisor)})"
        parts.append(text if coef == 1 else f"{size(coef)} * {text}")
    if e.const != 0 or not parts:
        parts.append(size(e.const))
    return " + ".join(parts)


def held_value(value, dtype: torch.dtype):
    """The value a constant of dtype holds: a bf16 or f16 constant is rounded to its dtype."""
    if dtype in (torch.bfloat16, torch.float16):
        return torch.tensor(float(value), dtype=dtype).item()
    return value


@dataclass(frozen=True)
class OpContext:
    """What a rule may read besides the arguments: the dtype the op computes in (its
    operands'), the dtype of its result, and each operand's dtype."""

    t: torch.dtype
    out: torch.dtype
    arg_types: tuple[torch.dtype, ...]

    @property
    def fp(self) -> bool:
        return self.t.is_floating_point


Rule = Callable[[tuple[str, ...], OpContext], "str | None"]


def infix(op: str, on_bool: str | None = None) -> Rule:
    """a op b; on bools, on_bool where the language's operator would not stay boolean."""
    return lambda a, c: f"({a[0]} {on_bool if on_bool and c.t is torch.bool else op} {a[1]})"


def on_fp(rule: Rule, otherwise: Rule | None = None) -> Rule:
    """rule on floating-point operands; otherwise (or no rendering) on others."""
    return lambda a, c: rule(a, c) if c.fp else (otherwise(a, c) if otherwise else None)


def first_arg(a, c) -> str:
    """The operand itself (rounding an integer, the sign of a bool)."""
    return a[0]


def render_op(table: dict[str, Rule], s: k.Compute, t: torch.dtype,
              arg_types: list[torch.dtype]) -> str | None:
    """s rendered by its row of table (t: the dtype it computes in); None where no row covers
    it."""
    rule = table.get(s.fn)
    return rule(s.args, OpContext(t, s.dtype, tuple(arg_types))) if rule is not None else None

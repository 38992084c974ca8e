"""Outer loops split where the kernel's indices divide them.

A repeat or a tile of a tensor reads x1 % 1024 along its innermost loop: the C++ compiler
cannot tell that the reads are contiguous and gathers them one element at a time. An outer
loop x of extent n whose indices take
x // d or x % d, d dividing n, is walked as two loops, x = xq * d + xr: the indices become
xq and xr, affine, and the inner loop reads contiguously.
"""

from __future__ import annotations

import dataclasses

from kiln.ir import kernel as k
from kiln.ir.index import Expr, FloorDiv, Mod, Sym, as_expr, substitute

SPLIT_ROUNDS = 4  # loops split again where their parts are divided further


def split_at_divisors(kernel: k.Kernel) -> k.Kernel:
    for _ in range(SPLIT_ROUNDS):
        split = _split_once(kernel)
        if split is kernel:
            return kernel
        kernel = split
    return kernel


def _split_once(kernel: k.Kernel) -> k.Kernel:
    statements = [s for st in kernel.stages for s in st.body]
    indices = [s.index for s in statements if isinstance(getattr(s, "index", None), Expr)]
    for x in reversed(kernel.outer):
        if not isinstance(x.extent, int):
            continue
        divisors = {d for e in indices for d in _divisors_of(e, x)
                    if isinstance(d, int) and 1 < d < x.extent and x.extent % d == 0}
        if not divisors:
            continue
        d = min(divisors)
        quotient, remainder = Sym(f"{x.name}q", x.extent // d), Sym(f"{x.name}r", d)
        mapping = {x: as_expr(quotient) * d + as_expr(remainder)}
        outer = tuple(p for o in kernel.outer for p in ((quotient, remainder) if o == x else (o,)))
        stages = tuple(k.Stage(st.loop, tuple(_substituted(s, mapping) for s in st.body))
                       for st in kernel.stages)
        return dataclasses.replace(kernel, outer=outer, stages=stages)
    return kernel


def _divisors_of(e: Expr, x: Sym) -> list:
    """The divisors of the floor-divisions and remainders of x itself in e, at any depth."""
    found = []
    for atom, _ in e.terms:
        if isinstance(atom, (FloorDiv, Mod)):
            if atom.arg == as_expr(x):
                found.append(atom.divisor)
            found.extend(_divisors_of(atom.arg, x))
    return found


def _substituted(s: k.Stmt, mapping: dict) -> k.Stmt:
    index = getattr(s, "index", None)
    if not isinstance(index, Expr):
        return s
    return dataclasses.replace(s, index=substitute(index, mapping))

"""Outer loops merged where the kernel's indices walk them as one, and split where its
indices divide them.

A point-wise kernel over [N, C, H, W] whose every index steps W's extent times further along H
than along W walks H and W as one loop: the innermost loop is longer, and a transposing
kernel's tiles (cpp.py) are whole where W alone is not a multiple of a tile's side.

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
from kiln.ir.sizes import known_eq, simplify

SPLIT_ROUNDS = 4  # loops split again where their parts are divided further


def merge_contiguous(kernel: k.Kernel) -> k.Kernel:
    """A point-wise kernel's neighbouring outer loops a, b as one loop over both wherever
    every index takes a and b only as coef(b) * (extent(b) * a + b)."""
    if kernel.reduce:
        return kernel
    statements = [s for st in kernel.stages for s in st.body]
    indices = [s.index for s in statements if isinstance(getattr(s, "index", None), Expr)]
    outer = list(kernel.outer)
    i = 0
    while i + 1 < len(outer):
        a, b = outer[i], outer[i + 1]
        if not all(_walks_as_one(e, a, b) for e in indices):
            i += 1
            continue
        merged = Sym(a.name, simplify(a.extent * b.extent))
        indices = [_merged(e, a, b, merged) for e in indices]
        statements = [_merged_stmt(s, a, b, merged) for s in statements]
        outer[i:i + 2] = [merged]
    if len(outer) == len(kernel.outer):
        return kernel
    it = iter(statements)
    stages = tuple(k.Stage(st.loop, tuple(next(it) for _ in st.body)) for st in kernel.stages)
    return dataclasses.replace(kernel, outer=tuple(outer), stages=stages)


def _walks_as_one(e: Expr, a: Sym, b: Sym) -> bool:
    return not {a, b} & e.nested_symbols() and known_eq(e.coef(a), simplify(e.coef(b) * b.extent))


def _merged(e: Expr, a: Sym, b: Sym, merged: Sym) -> Expr:
    rest = Expr(tuple(t for t in e.terms if t[0] not in (a, b)), e.const)
    return rest + as_expr(merged) * e.coef(b) if e.coef(b) != 0 else rest


def _merged_stmt(s: k.Stmt, a: Sym, b: Sym, merged: Sym) -> k.Stmt:
    index = getattr(s, "index", None)
    if not isinstance(index, Expr):
        return s
    return dataclasses.replace(s, index=_merged(index, a, b, merged))


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

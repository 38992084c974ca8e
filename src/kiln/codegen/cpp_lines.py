"""The loops along a line of a point-wise C++ kernel: transposing tiles and a checked line's
unchecked middle. Pure functions of the kernel; cpp.py emits what they choose.

A transposing kernel (one buffer contiguous along an outer loop, a row apart along the
innermost one) walks TILE x TILE tiles and copies each transposed operand's tile into a local
array (kiln_transpose_tile in the prelude), so that the vector loop reads it contiguously
instead of gathering an element from each of a tile's lines.

A line whose bounds checks along it are affine in its loop (a padded window's reads) holds
them all on a middle range: that range runs with the checks as constants, without their
arithmetic and selects.
"""

from __future__ import annotations

from kiln.codegen import base
from kiln.ir import kernel as k
from kiln.ir.index import Expr, Sym
from kiln.ir.sizes import is_symbolic
from kiln.ir.sizes import render as sc

TILE = 16  # a transposing kernel's tile side, in elements

# Below this many points per kernel, threads cost more than they save.
PARALLEL_MIN_WORK = 1 << 15


def at_least(n, limit: int) -> bool:
    """n >= limit; a size of a shape family counts as large (its kernels serve every size)."""
    return True if is_symbolic(n) else n >= limit


def _index(e: Expr) -> str:
    return base.render_index(e, "/", sc)


def tile_variants(xj: Sym, xi: Sym) -> list[tuple]:
    """(condition, ends, whole) for each body of a tile of loops xj, xi: whole tiles with
    constant trip counts, which the C++ compiler unrolls, then edge tiles (condition "": the
    other branch) unless both extents are multiples of TILE. ends(sym): where a tile stops."""
    def whole(sym: Sym) -> str:
        return f"{sym.name}b + {TILE}"

    def edge(sym: Sym) -> str:
        return f"std::min<int64_t>({sym.name}b + {TILE}, {sc(sym.extent)})"

    if all(isinstance(sym.extent, int) and sym.extent % TILE == 0 for sym in (xj, xi)):
        return [("", whole, True)]
    cond = f"{whole(xj)} <= {sc(xj.extent)} && {whole(xi)} <= {sc(xi.extent)}"
    return [(cond, whole, True), ("", edge, False)]


def tile_copy(load: k.Load, storage: str, xj: Sym, xi: Sym, ends) -> list[str]:
    """The C++ lines declaring tile_<out> and copying load's tile into it, transposed.
    ends(sym): where the tile stops (None: a whole tile)."""
    rest = Expr(tuple(t for t in load.index.terms if t[0] not in (xj, xi)), load.index.const)
    stride = sc(load.index.coef(xi))
    corner = f"{xj.name}b + {stride} * {xi.name}b"
    if rest != Expr():
        corner += f" + {_index(rest)}"
    rows, cols = (f"{ends(sym)} - {sym.name}b" if ends else str(TILE) for sym in (xi, xj))
    tile = f"tile_{load.out}"
    return [f"alignas(64) {storage} {tile}[{TILE}][{TILE}];",
            f"kiln_transpose_tile({load.buf} + {corner}, {stride}, &{tile}[0][0], {rows}, {cols});"]


def middle_range(name: str, start: str, stop: str, along: list) -> tuple[str, str, list[str]]:
    """(lo, hi, C++ declarations) of the range of loop `name` where every check in along
    (interior's) holds, within [start, stop); numbers where all bounds are."""
    firsts = [_number(start)] + [first for _, first, _ in along]
    ends = [_number(stop)] + [end for _, _, end in along]
    if all(isinstance(v, int) for v in firsts + ends):
        lo = min(ends[0], max(firsts))
        return str(lo), str(max(lo, min(ends))), []
    lo, hi = f"{name}_lo", f"{name}_hi"
    latest, earliest = ", ".join(map(str, firsts)), ", ".join(map(str, ends))
    return lo, hi, [f"const int64_t {lo} = std::min<int64_t>({stop}, std::max<int64_t>({{{latest}}}));",
                    f"const int64_t {hi} = std::max<int64_t>({lo}, std::min<int64_t>({{{earliest}}}));"]


def _number(text: str) -> int | str:
    """A literal's value, else the expression's text."""
    return int(text) if text.lstrip("-").isdigit() else text


def interior(kernel: k.Kernel, xi: Sym, per_line: set[int]):
    """(the line's own bounds checks, [(check, first, end)]) for a point-wise kernel whose
    bounds checks along its innermost loop xi are affine in it with a positive step: each
    holds for first <= xi < end (C++ expressions of the outer loops). None without bounds
    checks. A line with checks of its own only (a channels-last window's rows and columns)
    is peeled too: its loads would stay conditional, which keeps the loop scalar."""
    loops = set(kernel.outer) - {xi}
    line_masks, along = [], []
    for st in kernel.stages:
        for s in st.body:
            if not isinstance(s, k.InBounds):
                continue
            if id(s) in per_line:
                line_masks.append(s.out)
                continue
            c = s.index.coef(xi)
            rest = Expr(tuple(t for t in s.index.terms if t[0] != xi), s.index.const)
            affine = isinstance(c, int) and c > 0 and xi not in s.index.nested_symbols()
            if not affine or not rest.symbols() <= loops:
                continue
            r, n = _index(rest), sc(s.size)
            known = not rest.terms and isinstance(rest.const, int)
            # c * xi + r >= 0 from xi = ceil(-r / c) = -floor(r / c); < n up to floor((n - 1 - r) / c)
            first = -(rest.const // c) if known else f"-({r})" if c == 1 else f"-kiln_floordiv({r}, {c})"
            if known and isinstance(s.size, int):
                end = (s.size - 1 - rest.const) // c + 1
            else:
                end = f"{n} - ({r})" if c == 1 else f"kiln_floordiv({n} - 1 - ({r}), {c}) + 1"
            along.append((s, first, end))
    return (line_masks, along) if along or line_masks else None


def transposed_loads(kernel: k.Kernel, xj: Sym, xi: Sym) -> list[k.Load]:
    """The loads of a tiled kernel that step along its lines (xj) and jump along its
    innermost loop (xi), affine in both: read in place, each of a tile's lines of such a buffer
    is touched at every step of the innermost loop."""
    rows = {sc.name for sc in kernel.scratch}
    loops = set(kernel.outer)
    return [s for st in kernel.stages for s in st.body
            if isinstance(s, k.Load) and s.buf not in rows and s.mask is None
            and s.index.symbols() <= loops and not {xj, xi} & s.index.nested_symbols()
            and s.index.coef(xj) == 1
            and (is_symbolic(s.index.coef(xi)) or s.index.coef(xi) not in (0, 1))]


def transpose_tile(kernel: k.Kernel) -> Sym | None:
    """The outer loop to walk in tiles with the innermost one, for a point-wise kernel one of
    whose buffers steps a row apart along the innermost loop but is contiguous along another
    (a transposing copy): walking whole lines, every step of the innermost loop touched a new
    cache line of that buffer. None elsewhere."""
    if len(kernel.outer) < 2:
        return None
    inner = kernel.outer[-1]
    rows = {sc.name for sc in kernel.scratch}
    for st in kernel.stages:
        for s in st.body:
            if not isinstance(s, (k.Load, k.Store)) or s.buf in rows:
                continue
            step = s.index.coef(inner)
            if not is_symbolic(step) and step in (0, 1):
                continue
            for sym in kernel.outer[:-1]:
                if s.index.coef(sym) == 1 and at_least(sym.extent, TILE) and at_least(inner.extent, TILE):
                    return sym
    return None

"""Sizes of a shape family in Triton kernels (docs/dynamic_shapes.md).

A kernel of a family takes its sizes as plain int arguments ks0, ks1, ... after its buffers
(Kernel.sizes). Three kinds of choice read them:
- what the source says (loop bounds, masks, index arithmetic): the symbols themselves, so one
  source serves every size;
- launch configurations (block sizes): the traced example's sizes (hint), a choice of speed;
- what decides correctness at a size is made per launch: the grid, and whether index
  arithmetic runs in int64 (the WIDE constexpr, a second binary) because an index of this
  launch may reach 2^31.
A binary may assume every size argument a multiple of the kernel's vector (size_vector: the
elements in 16 bytes of its narrowest tensor), the way Triton's JIT specializes int arguments
that are multiples of 16; the direct launch picks it per launch (runtime/triton_family.py). It
is what lets masks and row starts over symbolic extents load whole vectors.
"""

from __future__ import annotations

from typing import Callable

import sympy

from kiln.ir import kernel as k
from kiln.ir import sizes

# The largest index int32 arithmetic holds, less a margin: a program's lanes past the end
# (up to a block beyond the last element, masked off) must not wrap around to valid indices.
INDEX_LIMIT = 2**31 - 1 - 2**16
# A looped row of symbolic length this many times its traced block or longer runs the
# long-row variant (the largest block a looped row takes): fewer, wider steps per row.
LONG_ROWS = 4
LONG_ROW_BLOCK = 2048


def sz(s: sizes.Size) -> str:
    """A size as Triton source: an int, or an expression over the kernel's ks0, ks1, ..."""
    return sizes.render(s, lang="python")


def is_family(kernel: k.Kernel) -> bool:
    """Whether a kernel takes sizes as arguments (and its source names them)."""
    return bool(kernel.sizes)


def size_names(kernel: k.Kernel) -> list[str]:
    return [f"ks{i}" for i in range(len(kernel.sizes))]


def hinted(kernel: k.Kernel, s: sizes.Size) -> int:
    """A size of the kernel (over ks0, ...) at the traced example: for choices of speed only."""
    if not sizes.is_symbolic(s):
        return int(s)
    traced = {k.size_param(i): sym for i, sym in enumerate(kernel.sizes)}
    return sizes.hint(sympy.sympify(s).xreplace(traced))


def size_function(kernel: k.Kernel, body: str) -> Callable:
    """A Python function of the kernel's size arguments computing `body` (source over ks0, ...)."""
    params = ", ".join(size_names(kernel))
    return eval(f"lambda {params}: {body}", {"max": max, "min": min})  # noqa: S307 - our own source


def index_extremes(kernel: k.Kernel) -> list[sizes.Size] | None:
    """The largest magnitudes the kernel's indices reach, as sizes; None where one is unbounded
    (an index loaded from memory): such a kernel always computes indices in int64."""
    points = kernel.outer_numel * kernel.reduce_numel if kernel.reduce else kernel.outer_numel
    out: list[sizes.Size] = [points]
    for st in kernel.stages:
        for s in st.body:
            if isinstance(s, (k.Load, k.Store)):
                b = s.index.bounds()
                if b is None:
                    return None
                out += [b[1], -b[0]]
    return out


def size_vector(kernel: k.Kernel) -> int:
    """The multiple a family's vector binary assumes of every size: the elements in 16 bytes
    of the kernel's narrowest tensor. At such sizes a row or a mask's end over a symbolic
    extent falls on a 16-byte boundary of every tensor (rows of 3000 bf16 elements do: a
    multiple of 16 would ask more than whole vectors need)."""
    return 16 // min((p.dtype.itemsize for p in kernel.params), default=1)


def divisibility_matters(kernel: k.Kernel) -> bool:
    """Whether assuming every size a multiple of the kernel's vector (size_vector) can change
    its binary: where a size appears in an index, a mask or a bound with a multiple that is
    not one of the vector already (8192 * ks0 is one for every ks0). Kernels where it cannot
    get no such binary."""
    from kiln.codegen.triton import flat_index, indexes_flat

    flat = indexes_flat(kernel)
    found: list[sizes.Size] = [kernel.outer_numel, kernel.reduce_numel]
    used: set = set()
    for st in kernel.stages:
        for s in st.body:
            index = getattr(s, "index", None)
            if index is not None:
                index = flat_index(kernel, index) if flat else index
                found += _index_sizes(index)
                used |= index.symbols()
            if isinstance(s, k.InBounds):
                found.append(s.size)
    found += [x.extent for x in (*kernel.outer, *kernel.reduce) if x in used or not flat]
    vector = size_vector(kernel)
    return any(_has_unaligned_term(e, vector) for e in found)


def _index_sizes(e) -> list[sizes.Size]:
    out = [e.const]
    for atom, c in e.terms:
        out.append(c)
        if hasattr(atom, "divisor"):
            out += [atom.divisor, *_index_sizes(atom.arg)]
    return out


def _has_unaligned_term(s: sizes.Size, vector: int) -> bool:
    """A term of s with a size in it whose coefficient is not a multiple of vector."""
    if not sizes.is_symbolic(s):
        return False
    for term in sympy.Add.make_args(sympy.expand(s)):
        coeff, _ = term.as_coeff_Mul()
        if term.free_symbols and not (coeff.is_Integer and int(coeff) % vector == 0):
            return True
    return False


def wide_function(kernel: k.Kernel) -> Callable[..., bool]:
    """Whether a launch at these sizes needs int64 index arithmetic (an index may reach 2^31)."""
    extremes = index_extremes(kernel)
    if extremes is None:
        return lambda *_: True
    symbolic = [e for e in extremes if sizes.is_symbolic(e)]
    if any(not sizes.is_symbolic(e) and e >= INDEX_LIMIT for e in extremes):
        return lambda *_: True
    if not symbolic:
        return lambda *_: False
    return size_function(kernel, f"max({', '.join(sz(e) for e in symbolic)}, 0) >= {INDEX_LIMIT}")


def grid_function(kernel: k.Kernel, config: tuple[int, int, int]) -> Callable[..., tuple[int, int, int]]:
    """The grid of a launch at these sizes (codegen/triton_launch.py's grid, computed per launch)."""
    from kiln.codegen.triton_launch import grid

    g = grid(kernel, config)
    return size_function(kernel, "(" + ", ".join(sz(d) for d in g) + ",)")


def ceil_div(n: sizes.Size, d: int) -> sizes.Size:
    """n / d rounded up, as a size (exact for every size of the family)."""
    if not sizes.is_symbolic(n):
        return (int(n) + d - 1) // d
    from torch.utils._sympy.functions import FloorDiv

    return FloorDiv(n + d - 1, d)


def launch_variants(kernel: k.Kernel, interpreted: bool) -> tuple[tuple, Callable[..., int]]:
    """A family kernel's launch configurations, and which one a launch at these sizes takes
    (its index). Block sizes decide speed only: every configuration is right for every size.
    One, the traced example's, except for rows of symbolic length: a kernel with a one-tile
    body (triton_launch.one_tile_variant) runs it, first, for rows that fit its tile; rows
    looped in blocks much shorter than the longest, LONG_ROWS times the block or longer, take
    LONG_ROW_BLOCK. The configurations of a kernel with a one-tile body carry ONE_TILE fourth."""
    from kiln.codegen.triton_launch import is_persistent, launch_config, one_tile_variant

    traced = launch_config(kernel, interpreted)
    looped = kernel.reduce and not is_persistent(kernel) and not k.column_reduction(kernel)
    rows = sz(kernel.reduce_numel) if kernel.reduce else "0"
    configs, fits = [], ""  # fits: the one-tile test that picks configuration 0
    if one_tile_variant(kernel):
        tile = launch_config(kernel, interpreted, one_tile=True)
        configs, fits = [(*tile, True)], f"0 if {rows} <= {tile[1]} else "
        traced = (*traced, False)
    first = len(configs)  # the traced looped configuration's index
    if not looped or not sizes.is_symbolic(kernel.reduce_numel) or traced[1] >= LONG_ROW_BLOCK:
        return (*configs, traced), size_function(kernel, f"{fits}{first}")
    long_rows = (1, LONG_ROW_BLOCK, 8) + traced[3:]
    longer = f"int({rows} >= {LONG_ROWS * traced[1]})"
    return (*configs, traced, long_rows), size_function(kernel, f"{fits}{first} + {longer}")


def family_choices(kernel: k.Kernel) -> str:
    """What a family's kernel decided about its sizes, and why (kiln.explain shows it)."""
    from kiln.codegen.triton_launch import is_persistent, one_tile_variant, row_tiled

    names = ", ".join(f"ks{i} = {s} (traced {sizes.hint(s)})" for i, s in enumerate(kernel.sizes))
    configs, _ = launch_variants(kernel, False)
    parts = [f"sizes {names} are arguments"]
    one_tile = one_tile_variant(kernel)
    if one_tile:
        (xblock, rblock, warps, _), *configs = configs
        parts.append(f"rows of length {kernel.reduce_numel} up to {rblock} in one tile "
                     f"(XBLOCK {xblock}, {warps} warps), longer ones looped")
    elif kernel.reduce and sizes.is_symbolic(kernel.reduce_numel):
        parts.append(f"rows of length {kernel.reduce_numel} are looped (no one block fits every length)")
    elif kernel.reduce:
        parts.append("whole rows in one block" if is_persistent(kernel) else "rows looped")
    elif not row_tiled(kernel) and len(kernel.outer) > 1 and not sizes.is_symbolic(kernel.outer[-1].extent):
        parts.append("one flat index (the lines' count is not known to fit a grid's second dimension)")
    (xblock, rblock, warps, *_), *longer = configs
    parts.append(f"XBLOCK {xblock}, RBLOCK {rblock}, {warps} warps from the traced example"
                 + (" for looped rows" if one_tile else ""))
    for x, r, w, *_ in longer:
        parts.append(f"rows of {LONG_ROWS * rblock} or more: XBLOCK {x}, RBLOCK {r}, {w} warps")
    parts.append("grid and int64 indexing per launch")
    if divisibility_matters(kernel):
        parts.append(
            f"binaries for sizes that are all multiples of {size_vector(kernel)} (whole 16-byte vectors) "
            "and for any"
        )
    else:
        vector = size_vector(kernel)
        parts.append(f"one binary for every size (no size's multiple of {vector} would change it)")
    return "; ".join(parts)

"""How a Triton kernel is tiled and launched: whether a row is one tile (persistent), split into
an aligned body and its edges, or looped; whether element-wise lines are a program row each;
each kernel's launch configuration (XBLOCK, RBLOCK, num_warps), its candidates under
autotuning, and its grid. The renderer (codegen/triton.py) follows these decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from kiln.codegen.triton_sizes import ceil_div, hinted, is_family, size_vector
from kiln.ir import index as ix
from kiln.ir import kernel as k
from kiln.ir import sizes
from kiln.ir.index import Expr
from kiln.ir.sizes import UNBACKED_HINT, exact_div, is_symbolic, known_divides, known_le

# Rows up to this length are reduced in one tile (and may keep values for later stages).
PERSISTENT_MAX = 4096
# Rows that start off 16-byte boundaries split (see split_rows) when at least this long; an
# edge tile of SPLIT_EDGE lanes (a warp's) holds the up to 2 x 15 elements around a body.
SPLIT_MIN = 256
SPLIT_EDGE = 32
# Programs that keep a GPU busy (an H100/H200 has 132 multiprocessors): a reduction with
# fewer is split across more.
BUSY_PROGRAMS = 1024
# a domain small enough that a kernel over it costs its launch, not its work (on an H100 or
# H200 65536 points of 4 bytes move in well under a launch's time)
SMALL_DOMAIN = 1 << 16
# the buffers a kernel merged from unrelated ones over a small domain moves at most: its few
# programs read and write every stream in turn, so a merge of many costs more than a launch
SMALL_MERGE_BUFFERS = 16
COLUMN_BLOCK = 32  # outputs one program of a column reduction computes
# Threads an H100/H200 keeps resident (132 multiprocessors of 2048), and the part of its 50 MB
# L2 cache that rows read again by a later pass of their program may take (the rest holds
# what the kernel writes, and lines of the other partition): see long_row_tile.
RESIDENT_THREADS = 132 * 2048
L2_ROW_BUDGET = 24 << 20


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p



def one_tile_variant(kernel: k.Kernel) -> bool:
    """A family's row of symbolic length whose traced example fits one tile: its kernel has a
    second body, run by launches whose rows fit (the ONE_TILE constexpr), that reduces the row
    in one tile as a persistent kernel does, so that later stages reuse the values loaded."""
    return (is_family(kernel) and bool(kernel.reduce) and is_symbolic(kernel.reduce_numel)
            and not k.column_reduction(kernel) and hinted(kernel, kernel.reduce_numel) <= PERSISTENT_MAX)


def is_persistent(kernel: k.Kernel) -> bool:
    """Whole rows in one tile: when they fit, unless the rows run across memory (then a
    narrow loop over them keeps loads coalesced), but always when values are kept."""
    # a row of a family's symbolic length is looped: no one block fits every length
    if not kernel.reduce or is_symbolic(kernel.reduce_numel) or kernel.reduce_numel > PERSISTENT_MAX:
        return False
    return bool(kernel.scratch) or not k.column_reduction(kernel)


MAX_GRID_Y = 65535  # CUDA's limit on a grid's second dimension


def row_tiled(kernel: k.Kernel) -> bool:
    """An element-wise kernel over long lines launches a program row per line (see render)."""
    if kernel.reduce or len(kernel.outer) < 2:
        return False
    inner = kernel.outer[-1].extent
    if is_family(kernel):  # the lines must fit the grid's second dimension at every size
        lines = exact_div(kernel.outer_numel, inner)
        return hinted(kernel, inner) >= 256 and known_le(lines, MAX_GRID_Y) and hinted(kernel, lines) >= 2
    return inner >= 256 and 2 <= kernel.outer_numel // inner <= MAX_GRID_Y


def _tiled_extent(kernel: k.Kernel) -> int:
    """The points an element-wise kernel's XBLOCK tiles: a line's, or the whole domain's
    (a family's at its traced example)."""
    members = getattr(kernel, "members", ())
    if members:  # a group (ir/group.py): its largest member's
        return max(m.outer_numel for m in members)
    return hinted(kernel, kernel.outer[-1].extent if row_tiled(kernel) else kernel.outer_numel)


def grid(kernel: k.Kernel, config: tuple[int, int, int]) -> tuple:
    """Programs along each axis: ints, or a family's sizes (triton_sizes.grid_function)."""
    xblock = config[0]
    members = getattr(kernel, "members", ())
    if members:  # a group (codegen/triton_group.py): its members' programs one after another
        return (sum((m.outer_numel + xblock - 1) // xblock for m in members), 1, 1)
    if row_tiled(kernel):
        inner = kernel.outer[-1].extent
        return (ceil_div(inner, xblock), exact_div(kernel.outer_numel, inner), 1)
    return (ceil_div(kernel.outer_numel, xblock), 1, 1)


def launch_config(kernel: k.Kernel, interpreted: bool, one_tile: bool = False) -> tuple[int, int, int]:
    """(XBLOCK, RBLOCK, num_warps): a small heuristic; the interpreter wants few programs.
    The defaults are the configurations autotuning picked most often for GPT-2's training
    kernels on the H200 (`python -m benchmarks.gpu_train --variants kiln-autotune`).
    A family's sizes are its traced example's (speed only); interpreted, a typical large
    size's, since a family serves larger sizes than its example and programs cost most there.
    one_tile: the configuration of a family's one-tile body (one_tile_variant), sized by the
    traced row."""

    def size(s) -> int:
        return UNBACKED_HINT if interpreted and is_symbolic(s) and not one_tile else hinted(kernel, s)

    outer = size(kernel.outer_numel)
    if not kernel.reduce:
        # wide tiles win even when a line's end masks off part of the last one; more values
        # per thread slow the math-heavy kernels more than they speed the copies
        # (docs/benchmarks.md)
        extent = UNBACKED_HINT if interpreted and is_family(kernel) else _tiled_extent(kernel)
        return next_pow2(min(extent, 4096 if interpreted else 1024)), 1, 4
    rnumel = size(kernel.reduce_numel)
    persistent = one_tile or is_persistent(kernel)
    if persistent:
        rblock = next_pow2(rnumel)
    elif k.column_reduction(kernel):
        if rnumel <= 64:  # short columns (the last step of a split reduction): wide tiles
            return min(128, next_pow2(outer)), next_pow2(rnumel), 4
        return min(COLUMN_BLOCK, next_pow2(outer)), min(128, next_pow2(rnumel)), 8
    else:  # a looped row: a family's row as long as its example's, up to 2048
        rblock = min(2048, next_pow2(rnumel))
    if split_rows(kernel) is not None:
        # one row per program, up to 32 elements per thread: fewer warps a row leave the
        # rows' two tiles less to combine, until a thread holds too many elements
        return 1, rblock, max(1, min(8, rblock // 1024))
    if interpreted:
        return next_pow2(max(1, min(outer, max(1, 8192 // rblock)))), rblock, 4
    if not persistent:
        if is_family(kernel):  # rows shorter than a block (a family's) go several a program
            return max(1, min(64, 2048 // rblock, next_pow2(outer))), rblock, 8 if rblock >= 2048 else 4
        return (1, *long_row_tile(kernel).config)
    if rblock <= 1024:
        # smaller programs for short rows (2048 elements over 2 warps); rows off 16-byte
        # boundaries are loaded element by element, where 1024 elements per program pay
        # (docs/benchmarks.md)
        tile = 2048 if rows_aligned(kernel) or traced_rows_aligned(kernel) else 1024
        return max(1, min(64, tile // rblock)), rblock, 2
    return max(1, min(64, 4096 // rblock)), rblock, 4


@dataclass(frozen=True)
class LongRowTile:
    config: tuple[int, int]  # (RBLOCK, num_warps)
    reason: str


def long_row_tile(kernel: k.Kernel) -> LongRowTile:
    """Chunk and warps of a row too long for one tile (one row per program, its passes back
    to back). When a later pass reads the row again (softmax's normalization after its max
    and sum), the rows in flight must fit in L2 for that read to come from L2 rather than
    device memory: wider programs (more warps) hold as many threads with fewer rows in
    flight. Each thread loads 8 elements of a chunk (16 bytes of bf16)."""
    loads = [(i, s) for i, st in enumerate(kernel.stages) if st.loop for s in st.body
             if isinstance(s, k.Load) and any(s.index.coef(r) == 1 for r in kernel.reduce)]
    row_bytes = sum({s.buf: s.dtype.itemsize for _, s in loads}.values()) * kernel.reduce_numel
    reread = len({i for i, _ in loads}) > 1
    if not reread or is_symbolic(row_bytes):
        return LongRowTile((2048, 8), "one pass over each row: nothing to keep in L2")
    for warps in (8, 16, 32):
        in_flight = RESIDENT_THREADS // (32 * warps)
        if in_flight * row_bytes <= L2_ROW_BUDGET:
            break
    return LongRowTile((256 * warps, warps), f"rows of {row_bytes} bytes read again by a later pass: "
                                             f"{in_flight} in flight at {warps} warps a row")


def rows_aligned(kernel: k.Kernel, vector_sizes: bool = False) -> bool:
    """Whether every row a kernel loads or stores along starts on a 16-byte boundary (given
    an aligned tensor), so that its rows load as whole vectors; with vector_sizes, where every
    size of a family is a multiple of its vector (size_vector: the binary for such sizes)."""
    along_rows = [s for st in kernel.stages for s in st.body
                  if isinstance(s, (k.Load, k.Store)) and any(s.index.coef(r) == 1 for r in kernel.reduce)]
    return all(_row_starts_aligned(kernel, s, vector_sizes) for s in along_rows)


def traced_rows_aligned(kernel: k.Kernel) -> bool:
    """Whether a family's rows start on 16-byte boundaries at its traced example, where its
    vector binary runs (the launch configuration is chosen for that example)."""
    vector = size_vector(kernel)
    return (is_family(kernel) and all(sizes.hint(s) % vector == 0 for s in kernel.sizes)
            and rows_aligned(kernel, vector_sizes=True))


def assumes_aligned_tensors(kernel: k.Kernel, vector_sizes: bool = False) -> bool:
    """Whether a kernel is compiled for 16-byte aligned tensors. Not when its rows start off
    16-byte boundaries and do not split: those load element by element, an aligned tensor
    beside them would load in wider pieces, and converting between the two layouts goes
    through shared memory. vector_sizes: the binary of a family for sizes that are all
    multiples of its vector, whose rows of symbolic length may start on boundaries."""
    return rows_aligned(kernel, vector_sizes) or split_rows(kernel) is not None


def _row_starts_aligned(kernel: k.Kernel, s: k.Load | k.Store, vector_sizes: bool = False) -> bool:
    steps = [s.index.coef(x) * s.dtype.itemsize for x in kernel.outer]
    if vector_sizes:
        steps = [times(step, size_vector(kernel)) for step in steps]
    return all(known_divides(16, step) for step in steps)


def times(size, multiple: int):
    """A size with each of its symbols taken as multiple times a symbol: the size where every
    size of the family is a multiple of multiple."""
    if not is_symbolic(size):
        return size
    expr = sympy.sympify(size)
    return sympy.expand(expr.xreplace({sym: multiple * sym for sym in expr.free_symbols}))


@dataclass(frozen=True)
class RowSplit:
    index: Expr  # the streamed buffers' common index
    vector: int  # elements in 16 bytes of the narrowest of them


def split_rows(kernel: k.Kernel) -> RowSplit | None:
    """How a persistent kernel over rows that start off 16-byte boundaries loads and stores
    them in whole vectors: each program takes one row and splits it into two tiles, an aligned
    body and an edge of the elements before and after it, whose reductions it combines as
    scalars (so that no value moves between the tiles' layouts through shared memory). The
    rows' buffers must share one index (each row then starts as far off a boundary in all of
    them), linear in the row element. A buffer read by column (a weight) is read from wherever
    the body starts (_column_load). None for aligned rows, rows shorter than SPLIT_MIN,
    argmax/argmin, and kernels that do not split. Two tiles beat one tile whose edge lanes are
    merged into the body's layout, which moves values through shared memory."""
    if not is_persistent(kernel) or len(kernel.reduce) != 1 or rows_aligned(kernel):
        return None
    reductions = [s for st in kernel.stages for s in st.body if isinstance(s, k.Reduce)]
    if kernel.reduce_numel < SPLIT_MIN or any(s.kind in ("argmax", "argmin") for s in reductions):
        return None
    r = kernel.reduce[0]
    streamed = [s for st in kernel.stages for s in st.body if isinstance(s, (k.Load, k.Store))
                and s.index.coef(r) == 1 and not _row_starts_aligned(kernel, s)]
    indices = {s.index for s in streamed}
    if len(indices) != 1:
        return None
    (index,) = indices
    if r in (index - ix.as_expr(r)).symbols():
        return None
    return RowSplit(index, 16 // min(s.dtype.itemsize for s in streamed))


def candidate_configs(kernel: k.Kernel) -> list[tuple[int, int, int]]:
    """A bounded set of (XBLOCK, RBLOCK, num_warps) worth timing on a GPU, heuristic first."""
    first = launch_config(kernel, False)
    if is_family(kernel):  # timings hold for one shape, a family serves many: the heuristic's
        return [first]
    if not kernel.reduce:
        cap = next_pow2(max(_tiled_extent(kernel), 1))
        options = [(min(x, cap), 1, w) for x, w in ((1024, 4), (1024, 2), (2048, 4), (2048, 8), (4096, 8))]
    elif split_rows(kernel) is not None:
        options = [(1, first[1], w) for w in (1, 2, 4, 8, 16) if first[1] >= 128 * w]
    elif is_persistent(kernel):
        rblock = next_pow2(kernel.reduce_numel)
        options = []
        for tile in (2048, 4096, 8192, 16384):
            xblock = max(1, tile // rblock)
            # 2 warps too: a row over fewer warps takes fewer instructions per element, which
            # pays where the kernel is bound by issuing them (LayerNorm+GELU)
            for warps in (2, 4, 8, 16):
                if warps * 32 * 2 <= xblock * rblock and xblock <= next_pow2(kernel.outer_numel):
                    options.append((xblock, rblock, warps))
    elif k.column_reduction(kernel):
        options = [(x, r, w) for x, r in ((64, 64), (128, 32), (32, 128), (256, 16)) for w in (4, 8)]
    else:  # the tiles that keep fewer long rows in flight first (long_row_tile)
        options = [(1, 8192, 32), (1, 4096, 16), (1, 2048, 8), (1, 4096, 8), (1, 1024, 8), (1, 2048, 16)]
    out = [first]
    for c in options:
        if c not in out:
            out.append(c)
    return out[:6]

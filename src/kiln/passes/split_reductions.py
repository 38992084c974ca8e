"""Split a long reduction with few outputs across many programs.

A reduction's outputs are its parallelism: the weight gradient of a LayerNorm (768 sums
over 16384 tokens) keeps a handful of GPU programs busy while the others idle. Splitting
the reduced extent R into S chunks gives S partial results per output, reduced in a
second, small step:

    sum(x[R, C], 0)  ->  sum(sum(x.view(S, R/S, C), 1), 0)

The first step still fuses whatever produces x. Only reductions whose partial results
combine exactly as the whole does are split (sum, prod, max, min, any, all: not argmax);
bf16/f16 sums keep float32 partials, so the result is rounded once, as eager rounds it. An
online sum of exp (reduce.expsum) is split as the two passes it stands for: the maximum in
partials, then the sum of exp(x - max x) in partials.

A floating-point column sum longer than MAX_SUM_CHUNK is split whatever its parallelism, into
chunks of at most that many terms (the sum of the partials splits again when they are that
many): a column kernel's program adds its column's terms one after another, and that running
sum's rounding error grows with its length (2**25 + 2 == 2**25 in float32), while eager and
Inductor sum in blocks. Row kernels need no split: they accumulate in a vector of running
sums (Triton) or in blocks (C++). An extent that no chunk count divides is padded with zeros.
"""

from __future__ import annotations

import math

import torch

from kiln.ir import index as ix
from kiln.ir.sizes import symbols
from kiln.ir.tensor import Builder, Graph, Node, Op, dim_syms
from kiln.lower.core import cast, pad, pointwise, reshape, view
from kiln.passes.simplify import simplify

SPLITTABLE = ("sum", "prod", "max", "min", "any", "all")
MIN_EXTENT = 2048  # shorter reductions are not worth a second step
MIN_CHUNK = 256  # elements each partial result reduces, at least
MAX_SUM_CHUNK = 1 << 16  # terms of a floating-point sum one partial result adds, at most


def split_reductions(graph: Graph, busy_programs: int, column_block: int) -> tuple[Graph, int]:
    """Split every long reduction that would run fewer than busy_programs / 2 programs into
    enough partial results to run about busy_programs (0: none), and every floating-point
    column sum longer than MAX_SUM_CHUNK into chunks; returns the new graph and how many split. A
    reduction over the last axis runs a program per output; one over other axes (a column
    reduction), a program per column_block outputs."""
    def rule(b: Builder, n: Node) -> Node | None:
        return _split(b, n, busy_programs, column_block)

    rule.__name__ = "split_reduction"
    graph, fired = simplify(graph, [rule])
    return graph, fired.get("split_reduction", 0)


def _split(b: Builder, n: Node, busy_programs: int, column_block: int) -> Node | None:
    if n.op is Op.REDUCE and n.attrs[0] == "expsum":
        return _split_expsum(b, n, busy_programs, column_block)
    if n.op is not Op.REDUCE or n.attrs[0] not in SPLITTABLE:
        return None
    kind, axes = n.attrs
    x = n.inputs[0]
    if symbols(x.shape):  # chunks of a family's reduction would need its length; the
        return None  # renderers sum long rows and columns in blocks (accuracy) anyway
    extent = math.prod(x.shape[a] for a in axes)
    rows = axes[-1] == len(x.shape) - 1
    programs = n.numel if rows else math.ceil(n.numel / column_block)
    long_sum = kind == "sum" and n.dtype.is_floating_point and extent > MAX_SUM_CHUNK and not rows
    idle = 0 < programs * 2 <= busy_programs and extent >= MIN_EXTENT
    if not (idle or long_sum):
        return None
    first = axes[0]
    if list(axes) == list(range(first, first + len(axes))):  # adjacent: merge them first
        x = reshape(b, x, x.shape[:first] + (extent,) + x.shape[first + len(axes):])
        axes = (first,)
    length = x.shape[first]
    chunks = 1
    if idle:
        chunks = _chunks(length, min(math.ceil(busy_programs / programs), extent // MIN_CHUNK))
    if long_sum and extent // chunks > MAX_SUM_CHUNK:
        chunks = _chunks_at_least(length, math.ceil(extent / MAX_SUM_CHUNK))
    if chunks < 2:
        return None
    chunk = -(-length // chunks)
    if chunk * chunks != length:  # zeros pad the last chunk
        x = pad(b, x, [0, 0] * (len(x.shape) - 1 - first) + [0, chunk * chunks - length], 0)
    split_shape = x.shape[:first] + (chunks, chunk) + x.shape[first + 1:]
    x = reshape(b, x, split_shape)
    inner_axes = (first + 1,) + tuple(a + 1 for a in axes[1:])
    # low-precision sums and products keep float32 partials (max, min, any, all are exact)
    low_precision = kind in ("sum", "prod") and n.dtype in (torch.bfloat16, torch.float16)
    partial_dtype = torch.float32 if low_precision else n.dtype
    if partial_dtype != x.dtype:
        x = cast(b, x, partial_dtype)
    partial_shape = tuple(s for i, s in enumerate(split_shape) if i not in inner_axes)
    partial = b.make(Op.REDUCE, (x,), (kind, inner_axes), partial_shape, partial_dtype)
    # the axes before the first reduced one are all kept: the chunk axis follows them
    total = b.make(Op.REDUCE, (partial,), (kind, (first,)), n.shape, partial_dtype)
    return cast(b, total, n.dtype)


def _split_expsum(b: Builder, n: Node, busy_programs: int, column_block: int) -> Node | None:
    """expsum(x) == sum(exp(x - max x)): where the maximum splits, the online sum is taken
    apart into that maximum and the sum over it, each split into partials (its partials
    would each need their own maximum). Many programs then read the row twice, where one
    program a row would read it once."""
    x, axes = n.inputs[0], n.attrs[1]
    row_max = b.make(Op.REDUCE, (x,), ("max", axes), n.shape, n.dtype)
    split_max = _split(b, row_max, busy_programs, column_block)
    if split_max is None:
        return None
    own_row = [ix.as_expr(d) for i, d in enumerate(dim_syms(x.shape)) if i not in axes]
    shifted = pointwise(b, "sub", x, view(b, split_max, own_row, x.shape))
    total = b.make(Op.REDUCE, (pointwise(b, "exp", shifted),), ("sum", axes), n.shape, n.dtype)
    return _split(b, total, busy_programs, column_block) or total


def _chunks_at_least(extent: int, wanted: int) -> int:
    """A chunk count of at least wanted (at most extent): a divisor of extent up to twice
    wanted, else wanted itself (the extent is then padded)."""
    wanted = min(wanted, extent)
    for s in range(wanted, min(2 * wanted, extent) + 1):
        if extent % s == 0:
            return s
    return wanted


def _chunks(extent: int, wanted: int) -> int:
    """The largest divisor of extent that is at most wanted (1: no split)."""
    for s in range(min(wanted, extent), 1, -1):
        if extent % s == 0:
            return s
    return 1

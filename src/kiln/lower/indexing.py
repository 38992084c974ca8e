"""Creation, gathers and concatenation: index maps whose indices may come from tensors."""

from __future__ import annotations

import torch

from kiln.ir import index as ix
from kiln.ir.tensor import Node, Op, dim_syms, value_sym
from kiln.lower import core
from kiln.lower.context import LowerCtx
from kiln.lower.core import Unsupported
from kiln.lower.registry import lowering

aten = torch.ops.aten


def _check_device(ctx: LowerCtx, device) -> None:
    if not ctx.result_on_graph_device():
        raise Unsupported(f"tensor created on {device}, not where the graph runs")


@lowering(aten.full.default)
def _full(ctx: LowerCtx, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(ctx, device)
    return core.constant(ctx.b, fill_value, ctx.out_dtype, tuple(size))


@lowering(aten.empty.memory_format)
def _empty(ctx: LowerCtx, size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(ctx, device)
    return core.constant(ctx.b, 0, ctx.out_dtype, tuple(size))  # any value will do; zeros are cheapest


@lowering(aten.scalar_tensor.default)
def _scalar_tensor(ctx: LowerCtx, value, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(ctx, device)
    return core.constant(ctx.b, value, ctx.out_dtype, ())


@lowering(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default)
def _full_like(ctx: LowerCtx, x, fill_value=None, **kwargs):
    _check_device(ctx, kwargs.get("device"))
    if fill_value is None:
        fill_value = 1 if ctx.target is aten.ones_like.default else 0
    return core.constant(ctx.b, fill_value, ctx.out_dtype, ctx.out_shape)


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(ctx: LowerCtx, *args, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(ctx, device)
    start, step = (0, 1)
    if len(args) >= 2:
        start = args[0]
    if len(args) == 3:
        step = args[2]
    (n,) = ctx.out_shape
    return _range(ctx, n, start, step)


def _range(ctx: LowerCtx, n: int, start, step) -> Node:
    """start + step * i; IOTA counts in integers, so fractional ranges are computed in double
    and rounded once, as eager's arange does."""
    if isinstance(start, int) and isinstance(step, int):
        return ctx.b.make(Op.IOTA, (), (0, start, step), (n,), ctx.out_dtype)
    count = core.cast(ctx.b, ctx.b.make(Op.IOTA, (), (0, 0, 1), (n,), torch.int64), torch.float64)
    value = core.pointwise(ctx.b, "add", core.pointwise(ctx.b, "mul", count, float(step)), float(start))
    return core.cast(ctx.b, value, ctx.out_dtype)


@lowering(torch.ops.prims.iota.default)
def _iota(ctx: LowerCtx, length, *, start, step, dtype, device, requires_grad):
    _check_device(ctx, device)
    return _range(ctx, length, start, step)


# Ops whose decompositions gather, by name (a node's original_aten may be another instance of
# the overload), with the error eager raises for them (kiln.ir.checks.RULES).
_DECOMPOSED_RULES = {
    "aten.nll_loss_forward.default": "nll_loss",
    "aten.nll_loss2d_forward.default": "nll_loss",
    "aten.take.default": "take",
    # indices computed from the output's positions, in range by construction
    "aten._unsafe_index.Tensor": "unchecked_index",
    "aten.upsample_nearest1d.vec": "unchecked_index",
    "aten.upsample_nearest2d.vec": "unchecked_index",
    "aten.upsample_nearest3d.vec": "unchecked_index",
    "aten.upsample_nearest1d.default": "unchecked_index",
    "aten.upsample_nearest2d.default": "unchecked_index",
    "aten.upsample_nearest3d.default": "unchecked_index",
}


def gather(ctx: LowerCtx, src: Node, index_map, indices: list[Node], shape, rule: str) -> Node:
    """out[d] = src[index_map(d)], where v_k in the map is indices[k][d]; generated code checks
    each index as rule (a key of kiln.ir.checks.RULES) says, and raises as eager does."""
    b = ctx.b
    shape = tuple(shape)
    origin = ctx.fx_node.meta.get("original_aten") if ctx.fx_node is not None else None
    rule = _DECOMPOSED_RULES.get(str(origin), rule)
    idx_nodes = tuple(core.cast(b, core.expand(b, i, shape), torch.int64) for i in indices)
    return b.make(Op.GATHER, (src,) + idx_nodes, (tuple(index_map), rule), shape, src.dtype)


@lowering(aten.embedding.default)
def _embedding(ctx: LowerCtx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    shape = indices.shape + weight.shape[1:]
    syms = dim_syms(shape)
    index_map = [ix.as_expr(value_sym(0))] + [ix.as_expr(s) for s in syms[len(indices.shape):]]
    idx = core.reshape(ctx.b, indices, indices.shape + (1,) * (len(weight.shape) - 1))
    return gather(ctx, weight, index_map, [idx], shape, "embedding")


@lowering(aten.index_select.default)
def _index_select(ctx: LowerCtx, x, dim, index):
    dim %= max(len(x.shape), 1)
    if not x.shape:
        raise Unsupported("index_select on a 0-d tensor")
    shape = x.shape[:dim] + (index.numel,) + x.shape[dim + 1:]
    syms = [ix.as_expr(s) for s in dim_syms(shape)]
    index_map = syms[:dim] + [ix.as_expr(value_sym(0))] + syms[dim + 1:]
    idx = core.reshape(ctx.b, index, (1,) * dim + (index.numel,) + (1,) * (len(shape) - dim - 1))
    return gather(ctx, x, index_map, [idx], shape, "index_select_dim1" if dim == 1 else "index_select")


@lowering(aten.gather.default)
def _gather(ctx: LowerCtx, x, dim, index, *, sparse_grad=False):
    if not x.shape:
        raise Unsupported("gather on a 0-d tensor")
    dim %= len(x.shape)
    shape = index.shape
    syms = [ix.as_expr(s) for s in dim_syms(shape)]
    index_map = syms[:dim] + [ix.as_expr(value_sym(0))] + syms[dim + 1:]
    return gather(ctx, x, index_map, [index], shape, "gather")


@lowering(aten.index.Tensor)
def _index(ctx: LowerCtx, x, indices):
    """Advanced indexing: tensors at some dims (broadcast together), None elsewhere."""
    tensors = [(d, i) for d, i in enumerate(indices) if i is not None]
    if any(i.dtype in (torch.bool, torch.uint8) for _, i in tensors):
        raise Unsupported("boolean-mask indexing has a data-dependent shape")
    positions = [d for d, _ in tensors]
    bshape = core.broadcast_shapes(*[i.shape for _, i in tensors])
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    rest_before = list(range(positions[0])) if adjacent else []
    rest_after = [d for d in range(len(x.shape)) if d not in positions and d not in rest_before]
    shape = tuple(x.shape[d] for d in rest_before) + bshape + tuple(x.shape[d] for d in rest_after)
    if tuple(shape) != tuple(ctx.out_shape):
        raise Unsupported("index layout not understood")
    syms = [ix.as_expr(s) for s in dim_syms(shape)]
    nb = len(rest_before)
    index_map: list = [None] * len(x.shape)
    for k, d in enumerate(rest_before):
        index_map[d] = syms[k]
    for k, d in enumerate(rest_after):
        index_map[d] = syms[nb + len(bshape) + k]
    idx_nodes = []
    for k, (d, i) in enumerate(tensors):
        index_map[d] = ix.as_expr(value_sym(k))
        i = core.expand(ctx.b, i, bshape)
        i = core.reshape(ctx.b, i, (1,) * nb + bshape + (1,) * len(rest_after))
        idx_nodes.append(i)
    return gather(ctx, x, index_map, idx_nodes, shape, "index")


@lowering(aten.scatter.value, aten.scatter.src)
def _scatter(ctx: LowerCtx, x, dim, index, src):
    """One index per line along dim (the gradient of nll_loss scatters so):
    out = where(position along dim == index, src, x), with no tensor materialized."""
    if not x.shape:
        raise Unsupported("scatter into a 0-d tensor")
    dim %= len(x.shape)
    others_match = all(index.shape[d] == x.shape[d] for d in range(len(x.shape)) if d != dim)
    if index.shape[dim] != 1 or not others_match:
        raise Unsupported("scatter of several values per line")
    if isinstance(src, Node):
        if src.shape != index.shape:
            raise Unsupported("scatter from a source larger than its index")
        src = core.expand(ctx.b, src, x.shape)
    # the index read through a gather of the positions along dim: the same value, checked
    along = tuple(n if d == dim else 1 for d, n in enumerate(x.shape))
    positions = ctx.b.make(Op.IOTA, (), (dim, 0, 1), along, torch.int64)
    index_map = [ix.as_expr(value_sym(0)) if d == dim else ix.as_expr(0) for d in range(len(along))]
    index = gather(ctx, positions, index_map, [index], index.shape, "scatter")
    position = ctx.b.make(Op.IOTA, (), (dim, 0, 1), x.shape, torch.int64)
    hit = core.pointwise(ctx.b, "eq", position, core.expand(ctx.b, index, x.shape))
    return core.pointwise(ctx.b, "where", hit, src, x, out_dtype=ctx.out_dtype)


# The lowering below selects each element's part by a chain of comparisons, one per part.
CAT_PARTS_LIMIT = 64


@lowering(aten.cat.default)
def _cat(ctx: LowerCtx, tensors, dim=0):
    """out = where(i < end0, part0, where(i < end1, part1, ...)), each part a padded view."""
    b = ctx.b
    parts = [t for t in tensors if not (len(t.shape) == 1 and t.shape[0] == 0)]
    shape = tuple(ctx.out_shape)
    if not parts:
        return core.constant(b, 0, ctx.out_dtype, shape)
    if len(parts) > CAT_PARTS_LIMIT:
        raise Unsupported(f"cat of {len(parts)} parts (over {CAT_PARTS_LIMIT}): each element would test "
                          f"every part; ATen copies each part once")
    dim %= len(shape)
    pieces, offset = [], 0
    for t in parts:
        spec = [0] * (2 * (len(shape) - dim))
        spec[-2], spec[-1] = offset, shape[dim] - offset - t.shape[dim]
        padded = core.pad(b, core.cast(b, t, ctx.out_dtype), spec, 0)
        offset += t.shape[dim]
        pieces.append((offset, padded))
    position = b.make(Op.IOTA, (), (dim, 0, 1), shape, torch.int64)
    out = pieces[-1][1]
    for end, piece in reversed(pieces[:-1]):
        out = core.pointwise(b, "where", core.pointwise(b, "lt", position, end), piece, out)
    return out

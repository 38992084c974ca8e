"""View ops -> index maps (no data moves)."""

from __future__ import annotations

import torch

from kiln.ir import index as ix
from kiln.ir.sizes import NeedsNumber, shape_env
from kiln.ir.tensor import dim_syms
from kiln.lower import core
from kiln.lower.context import LowerCtx
from kiln.lower.core import Unsupported
from kiln.lower.registry import lowering

aten = torch.ops.aten


@lowering(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def _view(ctx: LowerCtx, x, shape):
    return core.reshape(ctx.b, x, shape)


@lowering(aten.expand.default)
def _expand(ctx: LowerCtx, x, shape, *, implicit=False):
    shape = list(shape)
    off = len(shape) - len(x.shape)
    for i, s in enumerate(shape):
        if s == -1:
            shape[i] = x.shape[i - off]
    return core.expand(ctx.b, x, shape)


@lowering(aten.permute.default)
def _permute(ctx: LowerCtx, x, dims):
    return core.permute(ctx.b, x, dims)


@lowering(aten.t.default)
def _t(ctx: LowerCtx, x):
    return core.permute(ctx.b, x, list(reversed(range(len(x.shape)))))


@lowering(aten.transpose.int)
def _transpose(ctx: LowerCtx, x, d0, d1):
    perm = list(range(len(x.shape)))
    if perm:
        d0, d1 = d0 % len(perm), d1 % len(perm)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return core.permute(ctx.b, x, perm)


@lowering(aten.slice.Tensor)
def _slice(ctx: LowerCtx, x, dim=0, start=None, end=None, step=1):
    return core.slice_(ctx.b, x, dim, start, end, step)


@lowering(aten.slice_scatter.default)
def _slice_scatter(ctx: LowerCtx, x, src, dim=0, start=None, end=None, step=1):
    return core.slice_scatter(ctx.b, x, src, dim, start, end, step)


@lowering(aten.select.int)
def _select(ctx: LowerCtx, x, dim, index):
    return core.select(ctx.b, x, dim, index)


@lowering(aten.unsqueeze.default)
def _unsqueeze(ctx: LowerCtx, x, dim):
    return core.unsqueeze(ctx.b, x, dim)


@lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(ctx: LowerCtx, x, dim=None):
    return core.squeeze(ctx.b, x, [dim] if isinstance(dim, int) else dim)


@lowering(aten.constant_pad_nd.default)
def _pad(ctx: LowerCtx, x, pad, value=0):
    return core.pad(ctx.b, x, pad, value)


@lowering(aten.split_with_sizes.default)
def _split_with_sizes(ctx: LowerCtx, x, split_sizes, dim=0):
    out, start = [], 0
    for size in split_sizes:
        out.append(core.slice_(ctx.b, x, dim, start, start + size))
        start += size
    return tuple(out)


@lowering(aten.split.Tensor)
def _split(ctx: LowerCtx, x, split_size, dim=0):
    n = x.shape[dim % len(x.shape)]
    sizes = [min(split_size, n - s) for s in range(0, n, split_size)] or [0]
    return _split_with_sizes(ctx, x, sizes, dim)


@lowering(aten.unbind.int)
def _unbind(ctx: LowerCtx, x, dim=0):
    return tuple(core.select(ctx.b, x, dim, i) for i in range(x.shape[dim % len(x.shape)]))


@lowering(aten.as_strided.default)
def _as_strided(ctx: LowerCtx, x, size, stride, storage_offset=None):
    """A strided view of x's storage: only when that storage is x itself, laid out row-major."""
    val = ctx.arg_val(0)
    if shape_env() is not None:  # reading a symbolic storage's layout would add guards
        raise NeedsNumber("as_strided of a tensor of a shape family")
    if val is None or not _owns_contiguous_storage(val) or x.numel == 0:
        raise Unsupported("as_strided of a tensor whose storage layout is not plain row-major")
    syms = dim_syms(tuple(size))
    linear = ix.as_expr(storage_offset or 0)
    for sym, st in zip(syms, stride):
        linear = linear + ix.as_expr(sym) * st
    index_map, inner = [], 1
    for n in reversed(x.shape):
        index_map.append(ix.mod(ix.floordiv(linear, inner), n))
        inner *= n
    return core.view(ctx.b, x, list(reversed(index_map)), size)


def _owns_contiguous_storage(val: torch.Tensor) -> bool:
    if not val.is_contiguous() or val.storage_offset() != 0:
        return False
    return val.untyped_storage().nbytes() == val.numel() * val.element_size()


@lowering(aten.flip.default)
def _flip(ctx: LowerCtx, x, dims):
    flipped = {d % max(len(x.shape), 1) for d in dims}
    syms = [ix.as_expr(s) for s in dim_syms(x.shape)]
    index_map = [s * -1 + (n - 1) if d in flipped else s for d, (s, n) in enumerate(zip(syms, x.shape))]
    return core.view(ctx.b, x, index_map, x.shape)

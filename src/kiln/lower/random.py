"""kiln::philox -> Philox numbers computed inside the kernels that use them: a POINTWISE
function of the seed (a 0-d int64 tensor, broadcast) and each element's offset."""

from __future__ import annotations

import torch

from kiln.frontend.random import NORMAL, PHILOX_OP
from kiln.ir.sizes import as_size
from kiln.ir.tensor import Op
from kiln.lower.context import LowerCtx
from kiln.lower.core import Unsupported, constant, expand, pointwise
from kiln.lower.registry import lowering

FNS = {0: "philox_uniform", NORMAL: "philox_normal"}


def linear_offsets(ctx: LowerCtx, base: int, shape: tuple):
    """base + the row-major linear index of each element, in int64 (sizes may be symbols of
    the shape family: a stride is then a number read at run time)."""
    b = ctx.b
    offsets = constant(b, int(base), torch.int64, shape)
    stride: object = 1
    for dim in reversed(range(len(shape))):
        if not (isinstance(shape[dim], int) and shape[dim] == 1):
            position = b.make(Op.IOTA, (), (dim, 0, 1), shape, torch.int64)
            if not (isinstance(stride, int) and stride == 1):
                position = pointwise(b, "mul", position, constant(b, stride, torch.int64, shape))
            offsets = pointwise(b, "add", offsets, position)
        stride = stride * shape[dim]
    return offsets


@lowering(PHILOX_OP)
def _philox(ctx: LowerCtx, seed, offset, size, kind):
    if not isinstance(offset, int):
        raise Unsupported("a Philox offset known only at run time")
    if kind not in FNS:
        raise Unsupported(f"Philox kind {kind}")
    shape = tuple(as_size(s) for s in size)
    keys = expand(ctx.b, seed, shape)
    return ctx.b.make(Op.POINTWISE, (keys, linear_offsets(ctx, offset, shape)), (FNS[kind],), shape,
                      torch.float32)

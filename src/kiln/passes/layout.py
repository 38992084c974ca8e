"""Strides of stored tensors: given for inputs and ATen results, chosen for kernel outputs."""

from __future__ import annotations

from kiln.ir.tensor import Graph, Node, Op, contiguous_strides


def is_dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when the strides are a permutation of a contiguous layout (no gaps, no overlap)."""
    dims = sorted((st, sz) for st, sz in zip(stride, shape) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def same_strides(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether two layouts of shape address the same elements: strides of dimensions of size 1
    (never stepped along) do not matter, nor does anything when the tensor is empty."""
    if len(a) != len(b):
        return False
    return 0 in shape or all(x == y for x, y, n in zip(a, b, shape) if n != 1)


def is_non_overlapping(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when no two elements share an address (gaps allowed): a kernel can store each."""
    dims = sorted((st, sz) for st, sz in zip(stride, shape) if sz != 1)
    extent = 1
    for st, sz in dims:
        if st < extent:
            return False
        extent = st * (sz - 1) + extent
    return True


class Layouts:
    def __init__(self, graph: Graph):
        self._out: dict[Node, tuple[int, ...]] = {}
        # eager's strides, gaps included (a strided view's), so that the buffer returned
        # and the tensors saved for a backward have exactly those
        for node, stride in zip(graph.outputs, graph.output_strides or []):
            if (isinstance(node, Node) and stride is not None and node not in self._out
                    and len(stride) == len(node.shape) and is_non_overlapping(node.shape, stride)):
                self._out[node] = tuple(stride)

    def __call__(self, n: Node) -> tuple[int, ...] | None:
        if n.op is Op.INPUT:
            return n.attrs[1]
        if n.op is Op.EXTERN:
            layout = n.attrs[3][0] if n.attrs[5] else None
            return layout.stride if layout is not None else None
        if n.op is Op.ITEM:
            return n.inputs[0].attrs[3][n.attrs[0]].stride
        return self._out.get(n) or contiguous_strides(n.shape)

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


class Layouts:
    def __init__(self, graph: Graph):
        self._out: dict[Node, tuple[int, ...]] = {}
        for node, stride in zip(graph.outputs, graph.output_strides or []):
            if isinstance(node, Node) and stride is not None and node not in self._out:
                if len(stride) == len(node.shape) and is_dense(node.shape, stride):
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

"""Strides of stored tensors: given for inputs and ATen results, chosen for the others.

A computed tensor takes the dimension order eager would give it: element-wise results follow
their inputs' order (TensorIterator's rule), reductions keep the order of the dims they keep,
views that permute dims permute it. A channels_last convolution's result thus stays
channels_last through element-wise and norm chains. Consumers come first where they ask: a
graph output takes eager's strides exactly, and a tensor an ATen op reads takes the strides
eager handed that op (a convolution reads channels_last without converting).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir import index as ix
from kiln.ir.sizes import hint, known_eq, known_le, simplify
from kiln.ir.tensor import MATERIALIZED, Graph, Node, Op, contiguous_strides, dim_syms

# EXTERN meta key: {input position: the strides eager handed the ATen op for that argument}
ARG_STRIDES = "arg_strides"
# meta key of a copy the program makes into another memory format: the strides it asks for
REQUESTED_STRIDES = "requested_strides"


def is_dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when the strides are a permutation of a contiguous layout (no gaps, no overlap)."""
    # sizes of a shape family sort by their example's values; the equalities hold for all
    dims = sorted(((st, sz) for st, sz in zip(stride, shape) if sz != 1), key=_by_hint)
    expected = 1
    for st, sz in dims:
        if not known_eq(st, expected):
            return False
        expected = simplify(expected * sz)
    return True


def _by_hint(pair: tuple) -> tuple[int, int]:
    return hint(pair[0]), hint(pair[1])


def same_strides(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether two layouts of shape address the same elements: strides of dimensions of size 1
    (never stepped along) do not matter, nor does anything when the tensor is empty."""
    if len(a) != len(b):
        return False
    return 0 in shape or all(known_eq(x, y) for x, y, n in zip(a, b, shape) if n != 1)


def is_non_overlapping(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when no two elements share an address (gaps allowed): a kernel can store each."""
    dims = sorted(((st, sz) for st, sz in zip(stride, shape) if sz != 1), key=_by_hint)
    extent = 1
    for st, sz in dims:
        if not known_le(extent, st):  # for every size of a shape family
            return False
        extent = simplify(st * (sz - 1) + extent)
    return True


def dense_strides(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a dense tensor whose dims, outermost first, are order."""
    strides, acc = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = acc
        acc = simplify(acc * (shape[d] if not isinstance(shape[d], int) else max(shape[d], 1)))
    return tuple(strides)


def dim_order(shape: tuple[int, ...], operands: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Dims outermost first, as TensorIterator orders them for an element-wise result: for
    each pair of dims the first operand whose strides there differ (neither broadcast, 0)
    decides; equal strides put the larger dim outside; no decision keeps the logical order."""

    def inner_first(d0: int, d1: int) -> int:  # > 0: d1 goes inside d0 (d0 is outer)
        for strides in operands:
            s0, s1 = abs(strides[d0]), abs(strides[d1])  # a flipped view walks its dims alike
            if s0 == 0 or s1 == 0:
                continue
            # a shape family's sizes compare by their example's values (a choice of speed)
            if not known_eq(s0, s1):
                return -1 if hint(s0) < hint(s1) else 1
            if not known_eq(shape[d0], shape[d1]):
                return 1 if hint(shape[d0]) > hint(shape[d1]) else -1
        return 0

    perm = list(reversed(range(len(shape))))  # innermost first, as ATen sorts it
    for i in range(1, len(perm)):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = inner_first(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    return tuple(reversed(perm))


def is_channels_last_order(order: tuple[int, ...]) -> bool:
    return len(order) >= 3 and order == (0, *range(2, len(order)), 1)


def order_name(shape: tuple[int, ...], stride: tuple[int, ...]) -> str:
    """'contiguous', 'channels_last' or the dims outermost first, for explain."""
    order = dim_order(shape, [stride])
    if order == tuple(range(len(shape))):
        return "contiguous"
    if is_channels_last_order(order):
        return "channels_last"
    return "dims " + "".join(map(str, order)) + " outermost first"


@dataclass(frozen=True)
class LayoutChoice:
    """The strides chosen for a computed tensor, and why (what explain and tests read)."""

    node: str  # as IR text: "%12 pointwise.add"
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    reason: str

    @property
    def name(self) -> str:
        return order_name(self.shape, self.stride)

    def __str__(self) -> str:
        return f"{self.node} {list(self.shape)}: {self.name} {list(self.stride)}, {self.reason}"


def node_label(n: Node) -> str:
    return f"%{n.id} {n.op.value}" + (f".{n.attrs[0]}" if n.op in (Op.POINTWISE, Op.REDUCE) else "")


def _view_strides(n: Node, src_stride: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides a view has over its source's: the coefficients of its affine index map (0 along
    broadcast dims); None when it reshapes through a division (eager copies those)."""
    linear = ix.as_expr(0)
    for e, st in zip(n.attrs[0], src_stride):
        linear = linear + e * st
    if not linear.is_affine():
        return None
    return tuple(linear.coef(s) for s in dim_syms(n.shape))


def _propagate(graph: Graph) -> dict[Node, tuple[int, ...]]:
    """Eager's strides of every tensor, as its producer gives them (0 where a view broadcasts)."""
    out: dict[Node, tuple[int, ...]] = {}
    for n in graph.nodes:
        if n.op in (Op.INPUT, Op.EXTERN, Op.ITEM):
            given = _given(n)
            out[n] = given if given is not None else contiguous_strides(n.shape)
        elif n.op is Op.CONSTANT:
            out[n] = (0,) * len(n.shape)
        elif n.op is Op.VIEW:
            out[n] = _view_strides(n, out[n.inputs[0]]) or contiguous_strides(n.shape)
        elif REQUESTED_STRIDES in n.meta and is_dense(n.shape, n.meta[REQUESTED_STRIDES]):
            out[n] = n.meta[REQUESTED_STRIDES]
        elif n.op is Op.POINTWISE:
            operands = [out[i] for i in n.inputs if i.shape == n.shape]
            out[n] = dense_strides(n.shape, dim_order(n.shape, operands))
        elif n.op is Op.REDUCE:
            src = n.inputs[0]
            axes = set(n.attrs[1])
            kept = tuple(st for d, st in enumerate(out[src]) if d not in axes)
            out[n] = dense_strides(n.shape, dim_order(n.shape, [kept])) if len(kept) == len(n.shape) \
                else contiguous_strides(n.shape)
        else:  # IOTA, GATHER: in logical order
            out[n] = contiguous_strides(n.shape)
    return out


def _given(n: Node) -> tuple[int, ...] | None:
    if n.op is Op.INPUT:
        return n.attrs[1]
    if n.op is Op.EXTERN:
        layout = n.attrs[3][0] if n.attrs[5] else None
        return layout.stride if layout is not None else None
    return n.inputs[0].attrs[3][n.attrs[0]].stride


def _choice(n: Node, stride: tuple[int, ...], reason: str) -> LayoutChoice:
    return LayoutChoice(node_label(n), n.shape, stride, reason)


def given_reason(n: Node) -> str:
    """Why a tensor kiln does not compute has its strides."""
    return "graph input" if n.op is Op.INPUT else "result of an ATen call"


class Layouts:
    """layouts(node) -> the strides node has when it is a buffer."""

    def __init__(self, graph: Graph):
        self._chosen: dict[Node, LayoutChoice] = {}
        # eager's strides, gaps included (a strided view's), so that the buffer returned
        # and the tensors saved for a backward have exactly those
        for node, stride in zip(graph.outputs, graph.output_strides or []):
            if (isinstance(node, Node) and stride is not None and node not in self._chosen
                    and len(stride) == len(node.shape) and is_non_overlapping(node.shape, stride)):
                self._chosen[node] = _choice(node, tuple(stride), "graph output: eager's strides")
        for n in graph.nodes:  # what an ATen op reads: the strides eager handed it
            wanted = n.meta.get(ARG_STRIDES, {}) if n.op is Op.EXTERN else {}
            for position, stride in wanted.items():
                arg = n.inputs[position]
                if arg.op in MATERIALIZED or arg in self._chosen or REQUESTED_STRIDES in arg.meta:
                    continue
                if len(stride) == len(arg.shape) and is_dense(arg.shape, stride):
                    why = f"read by ATen call %{n.id} {n.attrs[0]}, in the strides eager hands it"
                    self._chosen[arg] = _choice(arg, tuple(stride), why)
        self._eager = _propagate(graph)

    def __call__(self, n: Node) -> tuple[int, ...] | None:
        if n.op in (Op.INPUT, Op.EXTERN, Op.ITEM):
            return _given(n)
        return self.choice(n).stride

    def choice(self, n: Node) -> LayoutChoice:
        """The strides of a computed tensor with their reason."""
        if n in self._chosen:
            return self._chosen[n]
        eager = self._eager.get(n)
        if eager is None or not is_dense(n.shape, eager):
            order = dim_order(n.shape, [eager]) if eager is not None else tuple(range(len(n.shape)))
            stride = dense_strides(n.shape, order)
        else:
            stride = eager
        if REQUESTED_STRIDES in n.meta and stride == n.meta[REQUESTED_STRIDES]:
            choice = _choice(n, stride, "a copy into the memory format the program asks for")
        elif same_strides(n.shape, stride, contiguous_strides(n.shape)):
            choice = _choice(n, contiguous_strides(n.shape), "computed from tensors in logical order")
        else:
            choice = _choice(n, stride, "follows the order of the tensors it is computed from, as in eager")
        self._chosen[n] = choice
        return choice


def step_along(e: ix.Expr, sym: ix.Sym, syms: tuple[ix.Sym, ...]) -> int:
    """How far access e moves in memory for one step along sym, from the origin (through a
    reshape's divisions too); 0 where it does not move or depends on loaded values."""
    if e.is_affine():
        return e.coef(sym)
    origin = {s: ix.as_expr(0) for s in syms}
    at0, at1 = ix.substitute(e, origin), ix.substitute(e, {**origin, sym: ix.as_expr(1)})
    return at1.const - at0.const if not at0.terms and not at1.terms else 0


def _order_along(e: ix.Expr, syms: tuple[ix.Sym, ...]) -> tuple[ix.Sym, ...] | None:
    """syms outermost first as access e walks memory (largest step outside), or None when e
    does not step along each of them (a broadcast read, a gathered index)."""
    steps = {s: hint(abs(step_along(e, s, syms))) for s in syms}
    if 0 in steps.values():
        return None
    return tuple(sorted(syms, key=lambda s: -steps[s]))


def iteration_order(syms: tuple[ix.Sym, ...], accesses: list[ix.Expr]) -> tuple[ix.Sym, ...]:
    """The order a kernel's loops run over syms (outermost first): the memory order of the
    first access that steps along all of them, so that neighbouring points are neighbours
    in memory (a channels_last store iterates channels innermost). Dims of extent 1 go
    outside; without such an access, or in that order already, syms as given."""
    moving = tuple(s for s in syms if s.extent != 1)
    for e in accesses:
        order = _order_along(e, moving)
        if order is not None:
            if order == moving:
                return syms
            return tuple(s for s in syms if s.extent == 1) + order
    return syms


def access_orders(syms: tuple[ix.Sym, ...], accesses: list[tuple[str, ix.Expr]]) -> dict[str, tuple]:
    """For each buffer accessed stepping along all of syms (of extent > 1), the order in
    which it walks them: buffers with different orders make a transposing kernel."""
    moving = tuple(s for s in syms if s.extent != 1)
    out: dict[str, tuple] = {}
    for buf, e in accesses:
        order = _order_along(e, moving) if len(moving) > 1 else None
        if order is not None:
            out.setdefault(buf, order)
    return out

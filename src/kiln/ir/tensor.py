"""kiln IR level 1: a graph of operations on shaped, typed tensors.

Element-wise math, views and gathers are index maps and expressions, not copies: the
scheduler decides later which nodes become stored buffers. Nodes are immutable; a pass
builds a new graph through a Builder, which hash-conses nodes (structural CSE for free).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir.index import Sym
from kiln.ir.sizes import Size, as_size, dense_strides, simplify


class Op(enum.Enum):
    INPUT = "input"  # attrs: (position, strides)
    CONSTANT = "constant"  # attrs: (value,) broadcast to shape
    IOTA = "iota"  # attrs: (dim, start, step): start + step * index[dim]
    POINTWISE = "pointwise"  # attrs: (fn,) applied element by element to same-shaped inputs
    VIEW = "view"  # attrs: (index_map, valid, fill): out[i] = src[map(i)] if valid(i) else fill
    GATHER = "gather"  # attrs: (index_map, rule) map may use v0.. = inputs[1..][i], checked by the
    #                     rule (ir/checks.py) of the op it lowers
    REDUCE = "reduce"  # attrs: (kind, axes): reduce inputs[0] over axes (dropped); kinds: sum prod
    #                     max min any all argmax argmin, expsum (sum(exp(x - max x)) in one pass)
    EXTERN = "extern"  # attrs: (target, args, kwargs, layouts, reason, single): an ATen call
    ITEM = "item"  # attrs: (k,): the k-th result of a multi-output EXTERN


MATERIALIZED = (Op.INPUT, Op.EXTERN, Op.ITEM)


def dim_syms(shape: tuple[Size, ...], prefix: str = "d") -> tuple[Sym, ...]:
    return tuple(Sym(f"{prefix}{i}", n) for i, n in enumerate(shape))


def value_sym(k: int) -> Sym:
    """The value of a gather's k-th index input, at the output index."""
    return Sym(f"v{k}")


@dataclass(frozen=True)
class Layout:
    shape: tuple[Size, ...]
    stride: tuple[Size, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class ArgRef:
    """A tensor argument of an EXTERN call: inputs[index] of the node."""

    index: int


@dataclass(frozen=True, eq=False)
class Node:
    id: int
    op: Op
    inputs: tuple[Node, ...]
    attrs: tuple[Any, ...]
    shape: tuple[Size, ...]  # ints, or expressions over the family's size symbols (ir/sizes.py)
    dtype: torch.dtype
    meta: dict = field(default_factory=dict, compare=False, repr=False)

    def __hash__(self) -> int:
        return self.id

    @property
    def numel(self) -> Size:
        n = 1
        for s in self.shape:
            n *= s
        return simplify(n)

    @property
    def fn(self) -> str:
        assert self.op is Op.POINTWISE
        return self.attrs[0]

    def __repr__(self) -> str:
        return f"%{self.id}"


def contiguous_strides(shape: tuple[Size, ...]) -> tuple[Size, ...]:
    return dense_strides(shape)


def dtype_name(dtype: torch.dtype) -> str:
    return {
        torch.float32: "f32",
        torch.float64: "f64",
        torch.float16: "f16",
        torch.bfloat16: "bf16",
        torch.int64: "i64",
        torch.int32: "i32",
        torch.int16: "i16",
        torch.int8: "i8",
        torch.uint8: "u8",
        torch.bool: "b8",
    }.get(dtype, str(dtype).replace("torch.", ""))


def type_str(node: Node) -> str:
    return f"{dtype_name(node.dtype)}[{', '.join(map(str, node.shape))}]"


def _attr_str(node: Node) -> str:
    a = node.attrs
    if node.op is Op.VIEW:
        index_map, valid, fill = a
        text = "[" + ", ".join(map(str, index_map)) + "]"
        if valid:
            conds = " and ".join(f"0 <= {e} < {n}" for e, n in valid)
            text += f" if {conds} else {fill}"
        return text
    if node.op is Op.GATHER:
        return "[" + ", ".join(map(str, a[0])) + f"] checked as {a[1]}"
    if node.op is Op.EXTERN:
        return f"{a[0]}"
    if node.op is Op.INPUT:
        return f"{a[0]}, stride={list(a[1])}"
    return ", ".join(str(x) for x in a)


def node_str(node: Node) -> str:
    ins = ", ".join(repr(i) for i in node.inputs)
    attrs = _attr_str(node)
    name = node.op.value + (f".{node.attrs[0]}" if node.op in (Op.POINTWISE, Op.REDUCE) else "")
    body = ", ".join(x for x in (ins, attrs if node.op not in (Op.POINTWISE,) else "") if x)
    if node.op is Op.REDUCE:
        body = f"{ins}, axes={list(node.attrs[1])}"
    return f"{node!r} = {name}({body}) : {type_str(node)}"


@dataclass
class Graph:
    """Nodes in topological order plus the graph's outputs (tensors or None/ints)."""

    nodes: list[Node]
    outputs: list[Any]
    num_inputs: int
    output_strides: list[tuple[int, ...] | None] = field(default_factory=list)  # as eager returns them
    # False where eager's output is a view (it may share memory); True where eager returns
    # new memory, which the compiled program must too, even when kiln computed no copy
    output_fresh: list[bool] = field(default_factory=list)
    # Where eager's output lives in memory an op of the graph allocated (not an input's): the
    # position of the first output in that memory, shared by outputs that are views of it;
    # None where it may be an input's. The compiled program must not hand out an input's
    # memory there, even when kiln computed no copy (cat with an empty part, clone).
    output_storage: list[int | None] = field(default_factory=list)
    # (argument position, size symbol) of each int argument that is a size of the shape family
    size_inputs: list[tuple[int, Any]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [node_str(n) for n in self.nodes]
        outs = ", ".join(repr(o) for o in self.outputs)
        lines.append(f"return ({outs})")
        return "\n".join(lines)

    def users(self) -> dict[Node, list[Node]]:
        out: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n)
        return out

    def output_nodes(self) -> list[Node]:
        return [o for o in self.outputs if isinstance(o, Node)]


class GraphGrowthLimit(Exception):
    """A lowering made more nodes than its budget: it would unroll work proportional to a
    tensor's size into the graph (and the generated source)."""


class Builder:
    """Creates nodes, reusing an existing node when an identical one was made already.
    While node_limit is set, making a node past that many raises GraphGrowthLimit."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._seen: dict[tuple, Node] = {}
        self.node_limit: int | None = None
        self.budget_start = 0
        # model code being lowered or rewritten: stamped as meta["origin"] on new nodes made
        # without one; a node rebuilt with an origin sets it for the rewrites that follow
        self.origin: Any = None

    def make(
        self,
        op: Op,
        inputs: tuple[Node, ...],
        attrs: tuple,
        shape: tuple[Size, ...],
        dtype: torch.dtype,
        meta: dict | None = None,
    ) -> Node:
        shape = tuple(simplify(as_size(s)) for s in shape)
        key = (op, tuple(i.id for i in inputs), _attrs_key(attrs), shape, dtype)
        pure = op not in (Op.EXTERN, Op.INPUT)  # externs may be random or effectful
        if pure:
            try:
                hit = self._seen.get(key)
            except TypeError:  # unhashable attrs: no sharing
                hit, pure = None, False
            if hit is not None:
                return hit
        if self.node_limit is not None and len(self.nodes) >= self.node_limit:
            raise GraphGrowthLimit(f"the lowering made more than {self.node_limit - self.budget_start} "
                                   f"nodes: it would unroll work proportional to a tensor's size")
        meta = meta or {}
        if "origin" in meta:
            self.origin = meta["origin"]
        elif self.origin is not None:
            meta = {**meta, "origin": self.origin}
        node = Node(len(self.nodes), op, tuple(inputs), attrs, shape, dtype, meta)
        self.nodes.append(node)
        if pure:
            self._seen[key] = node
        return node

    def limit_growth(self, nodes: int | None) -> None:
        """Allow this many more nodes (None: no limit)."""
        self.budget_start = len(self.nodes)
        self.node_limit = None if nodes is None else len(self.nodes) + nodes

    def finish(self, outputs: list[Any], num_inputs: int, output_strides=None, output_fresh=None,
               output_storage=None) -> Graph:
        return Graph(list(self.nodes), list(outputs), num_inputs, list(output_strides or []),
                     list(output_fresh or []), list(output_storage or []))


def _attrs_key(attrs: Any) -> Any:
    """attrs for hash-consing: floats by their text, so that 0.0 and -0.0 stay apart (they
    compare equal) and NaN constants are shared (they compare unequal)."""
    if isinstance(attrs, float):
        return ("float", repr(attrs))
    if isinstance(attrs, tuple):
        return tuple(_attrs_key(a) for a in attrs)
    return attrs


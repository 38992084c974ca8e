"""The source map: for each kernel and each ATen call of a compiled graph, the ops it computes
and the model code they came from (frontend/origin.py), and the kernel's name, which says what
it fuses (`kiln_layernorm_gelu_3`).

A kernel's nodes are its stored roots and everything it inlines: what the roots read up to
the buffers it loads. Names depend only on the graph, so that a graph compiled again gets the
same names and the kernel cache hits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.frontend.origin import ORIGIN, Origin
from kiln.ir.tensor import Node, Op

LABEL_CHARS = 32  # the most characters of labels in a kernel's name
MORE_SITES = 4  # sites listed in the text per entry before "and N more"
# nodes that move or make data rather than compute it: they name no kernel
_QUIET = (Op.VIEW, Op.CONSTANT, Op.IOTA, Op.INPUT)


@dataclass(frozen=True)
class SourceSite:
    """One place in the model code (an origin without its ATen op) and the ATen ops of it that
    one kernel or call computes."""

    origin: Origin
    ops: tuple[str, ...]

    def text(self) -> str:
        ops = ", ".join(dict.fromkeys(short_op(op) for op in self.ops))
        return f"{self.origin.text()}: {ops}" if ops else self.origin.text()


@dataclass(frozen=True)
class SourceEntry:
    """What one kernel (all its launches) or one ATen call computes, by model code."""

    name: str  # the kernel's name, or the buffer the ATen call writes
    kind: str  # "kernel" or "aten"
    sites: tuple[SourceSite, ...]
    per_launch: tuple[tuple[SourceSite, ...], ...] = ()  # each launch's sites, in program order

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(op for s in self.sites for op in s.ops))

    @property
    def origins(self) -> tuple[Origin, ...]:
        return tuple(s.origin for s in self.sites)

    def lines(self, indent: str = "    ") -> list[str]:
        shown = [f"{indent}from {s.text()}" for s in self.sites[:MORE_SITES]]
        if len(self.sites) > MORE_SITES:
            shown.append(f"{indent}... and {len(self.sites) - MORE_SITES} more places")
        return shown or [f"{indent}from no model code kiln could read (no stack trace)"]


def short_op(op: str) -> str:
    """"aten.mul.Tensor" -> "mul"; kiln's own ops ("pointwise.mul") as they are."""
    parts = op.split(".")
    return parts[1] if parts[0] == "aten" and len(parts) > 1 else op


def node_origins(graph) -> dict[int, Origin]:
    """Node id -> origin, for the nodes of graph that have one (decisions name nodes by id)."""
    return {n.id: n.meta[ORIGIN] for n in graph.nodes if ORIGIN in n.meta}


def kernel_nodes(roots: list[Node], stored) -> list[Node]:
    """The nodes one kernel computes: its roots and what they read, up to stored buffers."""
    seen: dict[int, Node] = {}
    stack = list(roots)
    roots_set = set(roots)
    while stack:
        n = stack.pop()
        if n.id in seen or (n in stored and n not in roots_set):
            continue
        seen[n.id] = n
        stack.extend(n.inputs)
    return [seen[i] for i in sorted(seen)]


def node_origin(n: Node) -> Origin | None:
    return n.meta.get(ORIGIN)


def _op_name(n: Node) -> str:
    """The ATen op a node computes part of (an ATen call: the op it calls)."""
    if n.op is Op.EXTERN:
        return str(n.attrs[0])
    o = node_origin(n)
    if o is not None and o.aten:
        return o.aten
    return n.op.value + (f".{n.attrs[0]}" if n.op in (Op.POINTWISE, Op.REDUCE) else "")


def container_modules(graph) -> frozenset[str]:
    """Module paths of the graph's code that hold other modules of it ("" and "h.0" when
    "h.0.ln_1" is there): their own code is glue, named by its ops rather than its class."""
    out = {""}
    for n in graph.nodes:
        o = node_origin(n)
        if o is not None and o.module:
            parts = o.module.split(".")
            out.update(".".join(parts[:k]) for k in range(1, len(parts)))
    return frozenset(out)


def kernel_label(nodes: list[Node], containers: frozenset[str] = frozenset()) -> str:
    """Words for what a kernel fuses, in program order, each once, at most LABEL_CHARS long:
    each computing node's module class where that module holds no other (containers), else
    its ATen op ("layernorm_gelu", "add_rmsnorm")."""
    words: dict[str, None] = {}
    for n in nodes:
        if n.op in _QUIET:
            continue
        o = node_origin(n)
        word = o.label(containers) if o is not None else ""
        words[word or re.sub(r"[^a-z0-9]+", "", _op_name(n).split(".")[-1].lower())] = None
    if not words:  # no arithmetic: what made the values (arange, a view's op), else a copy
        words = dict.fromkeys(node_origin(n).label(containers) for n in nodes
                              if n.op is not Op.INPUT and node_origin(n) is not None)
        words.pop("", None)
    label = ""
    for w in words:
        candidate = f"{label}_{w}" if label else w
        if len(candidate) > LABEL_CHARS:
            break
        label = candidate
    return label or (next(iter(words), "")[:LABEL_CHARS]) or "copy"


def kernel_name(nodes: list[Node], number: int, containers: frozenset[str] = frozenset()) -> str:
    """`kiln_<label>_<number>`: a valid C and Python identifier."""
    return f"kiln_{kernel_label(nodes, containers)}_{number}"


def _sites(nodes: list[Node]) -> list[SourceSite]:
    """Sites of the computing nodes; of views and constants only where nothing computes (a
    copy): views borrow their place from the computation around them."""
    computing = [n for n in nodes if n.op not in _QUIET and node_origin(n) is not None]
    by_place: dict[Origin, dict[str, None]] = {}
    for n in computing or nodes:
        o = node_origin(n)
        if o is None:
            continue
        place = Origin(o.module, o.module_class, o.file, o.line, o.code, "", o.backward)
        by_place.setdefault(place, {})[_op_name(n)] = None
    return [SourceSite(place, tuple(ops)) for place, ops in by_place.items()]


def build_source_map(steps, stored, kernels: dict[int, object], buffer_names: dict[Node, str]
                     ) -> dict[str, SourceEntry]:
    """Kernel name or ATen call's buffer -> SourceEntry, in execution order. steps: the
    schedule's kernel plans (with .roots) and extern nodes; kernels: id(plan) -> Kernel."""
    sites: dict[str, dict[SourceSite, None]] = {}
    launches: dict[str, list[tuple[SourceSite, ...]]] = {}
    kinds: dict[str, str] = {}
    for step in steps:
        if id(step) in kernels:
            name, kind, nodes = kernels[id(step)].name, "kernel", kernel_nodes(step.roots, stored)
        elif isinstance(step, Node) and step.op is Op.EXTERN and step in buffer_names:
            name, kind, nodes = buffer_names[step], "aten", [step]
        else:
            continue
        kinds[name] = kind
        entry = sites.setdefault(name, {})
        here = _sites(nodes)
        if kind == "aten" or kernels[id(step)].outer_numel != 0:  # an empty kernel is not launched
            launches.setdefault(name, []).append(tuple(here))
        for s in here:
            entry[s] = None
    return {name: SourceEntry(name, kinds[name], tuple(s), tuple(launches.get(name, ())))
            for name, s in sites.items()}

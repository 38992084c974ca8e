"""The fusion scheduler: which tensors are stored, which kernels compute them, and why.

Element-wise nodes, views and gathers are recomputed inside every kernel that reads them
(vertical fusion). A reduction is computed inside the kernel of its consumer when that
consumer iterates the reduction's input row by row (softmax, norms: one kernel per row
block); otherwise it is stored. Kernels over the same domain that do not depend on one
another merge into one (horizontal fusion). Every choice is a Decision with a reason.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kiln.ir import index as ix
from kiln.ir.ops import LIBRARY_MATH
from kiln.ir.sizes import hint, is_symbolic, known_le, numel
from kiln.ir.tensor import MATERIALIZED, Graph, Node, Op, dim_syms
from kiln.passes.layout import node_label, same_strides
from kiln.passes.roofline import Ceilings, fits_cache, function_cost, memory_seconds


@dataclass(frozen=True)
class Decision:
    node: str  # the node the decision is about, as IR text
    verdict: str  # "stored", "fused", "alias", "extern", "merged"
    reason: str


@dataclass
class KernelPlan:
    roots: list[Node]  # the nodes this kernel stores
    iter_shape: tuple[int, ...]
    axes: tuple[int, ...]  # reduction axes of iter_shape; () for a point-wise kernel

    @property
    def outer_shape(self) -> tuple[int, ...]:
        return tuple(s for i, s in enumerate(self.iter_shape) if i not in self.axes)


@dataclass(frozen=True)
class Alias:
    """A view of a stored buffer handed to an extern op without a copy."""

    base: Node
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass
class Schedule:
    graph: Graph
    stored: dict[Node, str]  # node -> why it is a buffer
    aliases: dict[Node, Alias]
    steps: list[KernelPlan | Node]  # kernels and extern calls, in execution order
    decisions: list[Decision] = field(default_factory=list)


class FusionMismatch(Exception):
    """Raised while emitting a kernel: a reduction is read at an index other than its row."""

    def __init__(self, node: Node, reason: str):
        super().__init__(reason)
        self.node = node
        self.reason = reason


_label = node_label


def _affine_view_of_buffer(n: Node, stored: dict[Node, str], layouts) -> Alias | None:
    if n.op is not Op.VIEW or n.attrs[1] or n.inputs[0] not in stored:
        return None
    base = n.inputs[0]
    base_stride = layouts(base)
    if base_stride is None:
        return None
    linear = ix.as_expr(0)
    for e, st in zip(n.attrs[0], base_stride):
        linear = linear + e * st
    if not linear.is_affine():
        return None
    stride = tuple(linear.coef(s) for s in dim_syms(n.shape))
    if not all(known_le(0, s) for s in (*stride, linear.const)):  # for every size of a family
        return None
    return Alias(base, n.shape, stride, linear.const)


def _store_base_of_view(n: Node, stored: dict[Node, str], aliases: dict[Node, Alias], layouts,
                        want_stride: tuple[int, ...] | None = None) -> bool:
    """Make n an alias of a stored tensor when it is an affine view of one. A view of a
    computed tensor stores that tensor instead (in its natural layout, so that its
    kernel keeps the row structure of reductions), when the view then is affine and has
    want_stride (eager's strides of an output), when given."""
    if n.op is not Op.VIEW or n.attrs[1]:
        return False
    base = n.inputs[0]
    newly_stored = base not in stored and base.op not in (Op.CONSTANT,)
    if newly_stored:
        stored[base] = f"viewed by %{n.id}, which is then passed on without a copy"
    alias = _affine_view_of_buffer(n, stored, layouts)
    if alias is not None and want_stride is not None:
        # the same elements as eager's view, with eager's strides exactly (also those of
        # dimensions of size 1): a backward compiled for them reads the output with them
        same = same_strides(n.shape, alias.stride, tuple(want_stride))
        alias = Alias(alias.base, alias.shape, tuple(want_stride), alias.offset) if same else None
    if alias is None:
        if newly_stored:
            del stored[base]
        return False
    aliases[n] = alias
    return True


def _transpose_of_stored_view(n: Node, stored: dict[Node, str], layouts) -> Alias | None:
    """n as a strided view of a stored view of the same source that n permutes (a padded
    operand of one matmul and its transpose read by another): one buffer serves both."""
    if n.op is not Op.VIEW or len(n.shape) > 4:
        return None
    index_map, valid, fill = n.attrs
    mine = dim_syms(n.shape)
    for other in stored:
        if (other.op is not Op.VIEW or other is n or other.inputs[0] is not n.inputs[0]
                or other.dtype != n.dtype or other.attrs[2] != fill or len(other.shape) != len(n.shape)):
            continue
        theirs = dim_syms(other.shape)
        for order in itertools.permutations(range(len(n.shape))):
            if any(other.shape[order[a]] != n.shape[a] for a in range(len(order))):
                continue
            rename = {theirs[order[a]]: ix.as_expr(mine[a]) for a in range(len(order))}
            renamed_map = [ix.substitute(ix.as_expr(e), rename) for e in other.attrs[0]]
            renamed_valid = {(ix.substitute(ix.as_expr(e), rename), k) for e, k in other.attrs[1]}
            if renamed_map != [ix.as_expr(e) for e in index_map]:
                continue
            if renamed_valid != {(ix.as_expr(e), k) for e, k in valid}:
                continue
            stride = layouts(other)
            if stride is None:
                return None
            return Alias(other, n.shape, tuple(stride[order[a]] for a in range(len(order))), 0)
    return None


def reductions_below(root: Node, stored, nested: bool = False) -> list[Node]:
    """Reductions an expression computes (not crossing stored tensors), in graph order;
    with nested, also those inside other reductions' inputs."""
    found, seen, stack = [], set(), list(root.inputs)
    while stack:
        n = stack.pop()
        if n in seen or n in stored:
            continue
        seen.add(n)
        if n.op is Op.REDUCE:
            found.append(n)
            if not nested:
                continue
        stack.extend(n.inputs)
    return sorted(found, key=lambda n: n.id)


def _required_buffers(plan: KernelPlan, stored: dict[Node, str]) -> set[Node]:
    return set(_stored_frontier([i for r in plan.roots for i in r.inputs], lambda n: n.inputs, stored))


def _stored_frontier(start: list[Node], step: Callable[[Node], Sequence[Node]], stored,
                     skip: Node | None = None) -> list[Node]:
    """The stored nodes a walk from start reaches (along step: inputs or users) without
    passing through another stored node or through skip."""
    found, seen, stack = [], set(), list(start)
    while stack:
        n = stack.pop()
        if n in seen or n is skip:
            continue
        seen.add(n)
        if n in stored:
            found.append(n)
        else:
            stack.extend(step(n))
    return found


def _domain(root: Node, stored: dict[Node, str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if root.op is Op.REDUCE:
        return root.inputs[0].shape, root.attrs[1]
    reductions = reductions_below(root, stored)
    for r in reductions:
        if r.inputs[0].shape == root.shape:
            return root.shape, r.attrs[1]
    for r in reductions:  # one value per row (a norm's saved mean or rstd): a row store
        if _squeezed(root.shape) == _squeezed(r.shape):
            return r.inputs[0].shape, r.attrs[1]
    return root.shape, ()


def _same_domain(step: KernelPlan, iter_shape: tuple[int, ...], axes: tuple[int, ...]) -> bool:
    """A value iterating (iter_shape, axes) can join step's kernel: its domain is step's, or
    one of the two is element-wise over the elements of the other's rows, which a row kernel
    visits anyway (the joined kernel then iterates rows)."""
    if step.iter_shape != iter_shape:
        return False
    if step.axes == axes:
        return True
    last = (len(iter_shape) - 1,)
    if (not axes and step.axes == last) or (not step.axes and axes == last):
        return True  # a row kernel visits every element: element-wise values join it
    return not axes and any(r.op is not Op.REDUCE and r.shape == iter_shape for r in step.roots)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def _eager_stride(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """The strides eager gives output node (its first occurrence), when known."""
    for o, stride in zip(graph.outputs, graph.output_strides):
        if o is node:
            return stride
    return None


# Why a value is stored that no kernel may recompute, not even the one that stores it.
READ_AS_STORED = "compared with a max or min of itself: stored once, so that every kernel reads the same bits"


def plan_stores(graph: Graph, layouts) -> tuple[dict[Node, str], dict[Node, Alias], list[Decision]]:
    """The nodes that must be buffers whatever the fusion: inputs, extern results, outputs,
    and extern arguments (unless an existing buffer can be viewed as one)."""
    stored: dict[Node, str] = {}
    aliases: dict[Node, Alias] = {}
    decisions: list[Decision] = []
    for n in graph.nodes:
        if n.op is Op.INPUT:
            stored[n] = "graph input"
        elif n.op in (Op.EXTERN, Op.ITEM):
            stored[n] = "result of an ATen call"
            if n.op is Op.EXTERN:
                decisions.append(Decision(_label(n) + f" {n.attrs[0]}", "extern", n.attrs[4]))
    for o in graph.output_nodes():
        if o not in stored and not _store_base_of_view(o, stored, aliases, layouts, _eager_stride(graph, o)):
            stored[o] = "graph output"
        elif o in aliases:
            decisions.append(Decision(_label(o), "alias", "output is a strided view of a stored tensor"))
    for n in _compared_with_own_extreme(graph):
        stored.setdefault(n, READ_AS_STORED)
    for n in graph.nodes:
        if n.op is not Op.EXTERN:
            continue
        for i in n.inputs:
            if i in stored or i in aliases:
                continue
            if _store_base_of_view(i, stored, aliases, layouts):
                why = f"strided view of a buffer passed to {n.attrs[0]}"
                decisions.append(Decision(_label(i), "alias", why))
            elif (transposed := _transpose_of_stored_view(i, stored, layouts)) is not None:
                aliases[i] = transposed
                why = f"a transpose of %{transposed.base.id}, passed to {n.attrs[0]} without a copy"
                decisions.append(Decision(_label(i), "alias", why))
            else:
                stored[i] = f"argument of ATen call {n.attrs[0]}"
    return stored, aliases, decisions


# Element-wise functions that give the same bits whichever kernel computes them: walked
# through to find the value an equality compares.
_EXACT_FNS = frozenset("neg abs cast maximum minimum where".split())


def _compared_with_own_extreme(graph: Graph) -> set[Node]:
    """Math-library values that an equality compares with a max or min over them (the
    backward of amax or of an inf-norm finds the winners so): recomputed in two kernels,
    their vector loops and scalar tails may round differently and no element would win."""
    found: set[Node] = set()
    for n in graph.nodes:
        if n.op is Op.POINTWISE and n.attrs[0] in ("eq", "ne") and len(n.inputs) == 2:
            a, b = (_library_sources(i, through_extremes=False) for i in n.inputs)
            a2, b2 = (_library_sources(i, through_extremes=True) for i in n.inputs)
            found |= (a & b2) | (b & a2)
    return found


def _library_sources(n: Node, through_extremes: bool) -> set[Node]:
    """The math-library values n is computed from by exact steps (and, if through_extremes,
    max/min reductions)."""
    out: set[Node] = set()
    stack, seen = [n], set()
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        if m.op is Op.POINTWISE and m.attrs[0] in LIBRARY_MATH:
            out.add(m)
        elif (m.op is Op.VIEW or (m.op is Op.POINTWISE and m.attrs[0] in _EXACT_FNS)
              or (through_extremes and m.op is Op.REDUCE and m.attrs[0] in ("max", "min"))):
            stack.extend(m.inputs)
    return out


# A value inlined into several consumers is recomputed by each. When computing it reads
# this many stored tensors or more (a residual stream adding up every earlier layer's
# output), storing it once may move fewer bytes than recomputing it everywhere.
RECOMPUTE_READ_LIMIT = 3


def _store_widely_read(graph: Graph, users: dict[Node, list[Node]], stored: dict[Node, str]) -> set[Node]:
    """Store such values where that moves fewer bytes; returns them. Recomputing costs each
    consuming kernel the reads it would not do anyway (a LayerNorm gradient's kernel reads
    the same tensors its inlined values read: for it recomputing is free); storing costs a
    write and one read per consumer. Consumers over one domain count as one kernel, as the
    scheduler merges them (a LayerNorm's output and the statistics saved for its backward).
    Values are weighed last to first: a value stored downstream (the residual gradient after
    a LayerNorm's) is then the one kernel that recomputes the values above it (the
    LayerNorm's input gradient), which stay inlined."""
    reads: dict[Node, frozenset] = {}
    for n in graph.nodes:
        reads[n] = (
            frozenset((n,))
            if n in stored
            else frozenset().union(*(reads[i] for i in n.inputs))
            if n.inputs
            else frozenset()
        )
    chosen: set[Node] = set()
    order = {n: k for k, n in enumerate(graph.nodes)}
    for n in reversed(graph.nodes):
        if n in stored or n.op not in (Op.POINTWISE, Op.GATHER) or len(reads[n]) < RECOMPUTE_READ_LIMIT:
            continue
        kernels = _reads_by_domain(_consuming_kernels(n, users, stored), n, stored, order)
        if len(kernels) < 2:
            continue
        recompute = sum(_nbytes(t) for besides in kernels for t in reads[n] - besides)
        if recompute > _nbytes(n) * (1 + len(kernels)):
            stored[n] = (
                f"inlined into {len(kernels)} kernels, each re-reading up to {len(reads[n])} "
                f"tensors: stored once instead"
            )
            chosen.add(n)
    return chosen


def _reads_by_domain(roots: list[Node], n: Node, stored, order: dict[Node, int]) -> list[set[Node]]:
    """What the kernels of roots read besides n, one set per kernel the scheduler would merge
    them into (as schedule does): a kernel over the same domain (a row kernel's, for an
    element-wise root) that computes or comes after every buffer the joining root reads."""
    domains = [_domain(root, stored) for root in roots]
    rows = {shape: (shape, axes) for shape, axes in domains if axes}
    kernels: list[tuple[tuple, list[Node], set[Node]]] = []  # (domain, roots, reads besides n)
    for root, (shape, axes) in sorted(zip(roots, domains), key=lambda t: order[t[0]]):
        domain = (shape, axes) if axes else rows.get(shape, (shape, axes))
        needs = _required_buffers(KernelPlan([root], shape, axes), stored)
        besides = _reads_besides(root, n, stored)
        for d, members, reads in kernels:
            if d == domain and all(order[b] < order[members[0]] or (b in members and b.op is not Op.REDUCE)
                                   for b in needs):
                members.append(root)
                reads |= besides
                break
        else:
            kernels.append((domain, [root], besides))
    return [reads for _, _, reads in kernels]


def _store_broadcast_math(graph: Graph, users: dict[Node, list[Node]], stored: dict[Node, str],
                          ceilings: Ceilings) -> set[Node]:
    """Store a math-library value (exp, cos, erf, ...) whose consuming kernels would compute it
    at more points than its own (rotary embeddings' cos and sin, broadcast over batch and
    heads) where the cost model predicts that computing it at the extra points takes longer
    than storing it once and reading it in each consumer; returns them. Last to first, as
    _store_widely_read."""
    chosen: set[Node] = set()
    for n in reversed(graph.nodes):
        if n in stored or n.op is not Op.POINTWISE or n.attrs[0] not in LIBRARY_MATH:
            continue
        own = hint(numel(n.shape))
        if own == 1:  # a kernel computes a scalar once, before its loops (an optimizer's bias corrections)
            continue
        kernels = _consuming_kernels(n, users, stored)
        computed = sum(hint(numel(_domain(root, stored)[0])) for root in kernels)
        recompute_s = max(computed - own, 0) * function_cost(n.attrs[0], ceilings) / ceilings.ops_per_s
        moved = _nbytes(n) * (1 + len(kernels))  # written once, read by each consumer
        cached = moved if fits_cache(moved, ceilings) else 0
        store_s = ceilings.kernel_launch_s + memory_seconds(moved, cached, ceilings)
        if recompute_s > store_s:
            stored[n] = (f"{n.attrs[0]} over {own} points would be computed at {computed} points by its "
                         f"consumers ({recompute_s * 1e6:.1f} us predicted against {store_s * 1e6:.1f} "
                         f"us to store it once): stored once instead")
            chosen.add(n)
    return chosen


def _consuming_kernels(n: Node, users: dict[Node, list[Node]], stored) -> list[Node]:
    """The stored values whose kernels compute n inline."""
    return _stored_frontier(users[n], lambda u: users[u], stored)


def _nbytes(n: Node) -> int:
    """Bytes of a value (a shape family's by its traced example: a choice of speed)."""
    return hint(n.numel) * n.dtype.itemsize


def _reads_besides(root: Node, skip: Node, stored) -> set[Node]:
    """The stored tensors root's kernel reads other than through skip."""
    return set(_stored_frontier(list(root.inputs), lambda n: n.inputs, stored, skip))


# A kernel computes an inlined value by recursion over its inputs: a chain deeper than this
# (a long element-wise chain, a sum of many tensors) is cut by storing a value, so that
# emitting a kernel stays far within Python's recursion limit.
INLINE_DEPTH_LIMIT = 64
# The most buffers one kernel reads and writes: a kernel is a call with one argument per
# buffer (ctypes takes at most 1024), and merging stops there.
KERNEL_BUFFER_LIMIT = 128


def _store_to_bound_kernels(graph: Graph, stored: dict[Node, str]) -> set[Node]:
    """Store values so that no kernel inlines more than INLINE_DEPTH_LIMIT levels below a
    stored value, nor reads more than KERNEL_BUFFER_LIMIT buffers; returns them."""
    depth: dict[Node, int] = {}
    reads: dict[Node, frozenset] = {}
    chosen: set[Node] = set()

    def store(n: Node, why: str) -> None:
        stored[n] = why
        chosen.add(n)
        depth[n], reads[n] = 0, frozenset((n,))

    for n in graph.nodes:
        if n in stored or not n.inputs:
            depth[n], reads[n] = 0, frozenset((n,)) if n in stored else frozenset()
            continue
        r = frozenset().union(*(reads[i] for i in n.inputs))
        if len(r) > KERNEL_BUFFER_LIMIT - 1:
            for i in n.inputs:
                if i not in stored and reads[i]:
                    store(i, f"a consumer would read {len(r)} buffers in one kernel: stored to split it")
            r = frozenset().union(*(reads[i] for i in n.inputs))
        d = 1 + max(depth[i] for i in n.inputs)
        if d > INLINE_DEPTH_LIMIT:
            store(n, f"computed {d} levels deep in one expression: stored to bound the kernel's depth")
        else:
            depth[n], reads[n] = d, r
    return chosen


def _points(shape) -> int | float:
    """A domain's points; a shape family's count as unbounded."""
    n = 1
    for d in shape:
        if is_symbolic(d):
            return math.inf
        n *= int(d)
    return n


def _may_merge_unrelated(shape, streams: int, max_points: int | None, max_buffers: int | None) -> bool:
    """Whether a kernel over shape may take an unrelated member and so move streams buffers."""
    if max_points is not None and _points(shape) > max_points:
        return False
    return max_buffers is None or streams <= max_buffers


def schedule(
    graph: Graph, stored: dict[Node, str], aliases: dict[Node, Alias], decisions: list[Decision],
    merge_unrelated_points: int | None = None, broadcast_math: Ceilings | None = None,
    merge_unrelated_buffers: int | None = None, unshared: frozenset[Node] = frozenset(),
) -> Schedule:
    """Kernels for every stored node that is computed, given the stored set so far. Kernels
    over one domain merge where independent; over a domain of more than merge_unrelated_points
    points, or into a kernel that would then move more than merge_unrelated_buffers buffers,
    only those that read a buffer in common (or one computes what the other reads).
    broadcast_math: the device's ceilings, to store math-library values that consumers would
    recompute at more points where the cost model says it pays (_store_broadcast_math); None:
    never (a GPU's math is nearly free and a store costs a launch). A reduction a kernel stores
    is also computed, in the same row, for a later reduction over that row that reads it
    (cross-entropy's maximum and its sum of exponentials: one read of each row where two
    kernels read it twice), except those in unshared (a consumer read them at other rows)."""
    users = graph.users()
    widely_read = _store_widely_read(graph, users, stored) | _store_to_bound_kernels(graph, stored)
    if broadcast_math is not None:
        widely_read |= _store_broadcast_math(graph, users, stored, broadcast_math)
    # Reductions that cannot run inside their consumers' kernels become stored; repeat
    # until every kernel's reductions fit its domain. Nested ones too: a reduction inside
    # another's input (softmax's max inside its sum) shares that row, or is stored.
    changed = True
    while changed:
        changed = False
        for n in graph.nodes:
            if n not in stored or n.op in MATERIALIZED:
                continue
            iter_shape, axes = _domain(n, stored)
            for r in reductions_below(n, stored, nested=True):
                if r in stored:
                    continue
                if r.inputs[0].shape != iter_shape or r.attrs[1] != axes:
                    stored[r] = f"its consumer {_label(n)} iterates {list(iter_shape)} over axes {list(axes)}"
                    changed = True
    plans: list[KernelPlan] = []
    steps: list[KernelPlan | Node] = []
    produced_before: dict[int, set[Node]] = {}
    buffers: dict[int, set[Node]] = {}  # what each kernel reads
    available: set[Node] = {n for n in graph.nodes if n.op is Op.INPUT}
    for n in graph.nodes:
        if n not in stored or n.op is Op.INPUT:
            continue
        if n.op in (Op.EXTERN, Op.ITEM):
            steps.append(n)
            available.add(n)
            continue
        iter_shape, axes = _domain(n, stored)
        plan = KernelPlan([n], iter_shape, axes)
        need = _required_buffers(plan, stored)
        merged = False
        for k, step in enumerate(steps):
            if (
                not isinstance(step, KernelPlan)
                or len(buffers[k]) + len(step.roots) >= KERNEL_BUFFER_LIMIT
                or not _same_domain(step, iter_shape, axes)
            ):
                continue
            # what the kernel stores element-wise, or reduces over n's rows, it can also
            # compute for n
            recomputable = {r for r in step.roots if stored[r] != READ_AS_STORED and (
                r.op is not Op.REDUCE
                or r not in unshared and r.inputs[0].shape == iter_shape and r.attrs[1] == axes)}
            related = (bool(need & (buffers[k] | set(step.roots)))
                       or _may_merge_unrelated(iter_shape, len(buffers[k] | need) + len(step.roots) + 1,
                                               merge_unrelated_points, merge_unrelated_buffers))
            if (
                related
                and need <= produced_before[k] | recomputable
                and len(buffers[k] | need) + len(step.roots) < KERNEL_BUFFER_LIMIT
            ):
                step.roots.append(n)
                step.axes = step.axes or axes
                buffers[k] |= need
                shared = [r for r in step.roots if r.op is Op.REDUCE and r in need]
                why = (f"which computes {', '.join(map(_label, shared))} for it in the same row" if shared
                       else "and independent of every kernel after it")
                decisions.append(Decision(_label(n), "merged", f"same domain {list(iter_shape)} as the "
                                          f"kernel storing {_label(step.roots[0])}, {why}"))
                merged = True
                break
        if not merged:
            produced_before[len(steps)] = set(available)
            buffers[len(steps)] = set(need)
            steps.append(plan)
            plans.append(plan)
        available.add(n)
    for n in graph.nodes:
        if n.op is Op.REDUCE and n not in stored:
            decisions.append(
                Decision(_label(n), "fused", "computed inside the kernel of its consumer, row by row")
            )
        elif n.op is Op.REDUCE or (n in stored and n in widely_read):
            decisions.append(Decision(_label(n), "stored", stored[n]))
    return Schedule(graph, stored, aliases, steps, decisions)

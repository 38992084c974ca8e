"""Lowering of scheduled kernels to kernel IR (level 2).

Each stored node of a kernel is emitted as an expression at the kernel's loop indices;
element-wise nodes, views and gathers are inlined on the way (each value computed once per
stage), stored tensors become loads, and reductions become loop stages of their own.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kiln.ir import index as ix
from kiln.ir import kernel as k
from kiln.ir.checks import ERROR_PARAM, RULES, Check
from kiln.ir.index import Expr, Sym
from kiln.ir.kernel import compute_dtype
from kiln.ir.sizes import known_le, known_lt
from kiln.ir.tensor import Node, Op, dim_syms, value_sym
from kiln.passes.fusion import Decision, FusionMismatch, KernelPlan, reductions_below
from kiln.passes.kernel_cse import merge_common_values
from kiln.passes.layout import (
    access_orders,
    given_reason,
    iteration_order,
    node_label,
    order_name,
    step_along,
)

# Integer divisions eager raises on when the divisor is zero.
INTEGER_DIVISIONS = frozenset({"floordiv", "truncdiv", "remainder", "fmod"})
# The most indices one kernel computes an inlined value at (see KernelEmitter._count_index).
INDEX_VARIANT_LIMIT = 8
# row arrays a kernel keeps at most: each is a row of up to the backend's row_scratch_limit
# values on a C++ thread's stack (or in a Triton program's registers)
KEPT_ROWS = 4
# reductions whose bf16/f16 result is not exact: it is rounded to its dtype before use
ROUNDED_REDUCTIONS = frozenset({"sum", "prod"})


class _StageBuilder:
    def __init__(self, loop: bool):
        self.loop = loop
        self.body: list[k.Stmt] = []
        self.memo: dict[tuple, str] = {}




class KernelEmitter:
    def __init__(self, name: str, plan: KernelPlan, buffer_names: dict[Node, str], layouts,
                 row_scratch_limit: int = 0, keep_loaded_rows: bool = False):
        self.name = name
        self.plan = plan
        self.buffer_names = buffer_names
        self.layouts = layouts
        self.outer = dim_syms(plan.outer_shape, "x")
        self.reduce = dim_syms(tuple(plan.iter_shape[a] for a in plan.axes), "r")
        self.stages: list[_StageBuilder] = []
        self.reduction_stage: dict[Node, int] = {}  # which of self.stages accumulates it
        self.stack: list[_StageBuilder] = []
        self.row_values: dict[Node, str] = {}
        self.params: dict[str, k.Param] = {}
        self.counter = 0
        self.scratch: dict[int, k.Scratch] = {}  # node id -> row array holding its values
        self.scratch_stage: dict[int, int] = {}  # node id -> the stage that stores its row array
        reduce_numel = 1
        for sym in self.reduce:
            reduce_numel *= sym.extent
        # a row kept in a local array must fit for every size of a shape family
        self.use_scratch = bool(self.reduce) and known_le(reduce_numel, row_scratch_limit)
        # buffers the kernel loads; the values it stores it recomputes where it reads them
        self.read_buffers = self.buffer_names.keys() - set(plan.roots)
        self.keep_loaded_rows = keep_loaded_rows
        self.checks: list[Check] = []  # what each Flag site reports
        self.indices_read: dict[int, set] = {}  # node id -> the indices a value is computed at

    # ------------------------------------------------------------------ helpers
    def _tmp(self) -> str:
        self.counter += 1
        return f"t{self.counter}"

    def _emit(self, stmt: k.Stmt) -> None:
        self.stack[-1].body.append(stmt)

    def _iter_index(self) -> tuple[Expr, ...]:
        """Indices of the iteration shape: outer symbols at kept axes, r at reduced ones."""
        out, xi, ri = [], iter(self.outer), iter(self.reduce)
        for a in range(len(self.plan.iter_shape)):
            out.append(ix.as_expr(next(ri) if a in self.plan.axes else next(xi)))
        return tuple(out)

    def _param(self, node: Node, is_output: bool) -> str:
        name = self.buffer_names[node]
        prev = self.params.get(name)
        self.params[name] = k.Param(name, node.dtype, is_output or (prev is not None and prev.is_output))
        return name

    def _linear(self, node: Node, index: tuple[Expr, ...]) -> Expr:
        linear = ix.as_expr(0)
        for e, st in zip(index, self.layouts(node)):
            linear = linear + e * st
        return linear

    # ------------------------------------------------------------------ emission
    def value(self, node: Node, index: tuple[Expr, ...], mask: str | None = None) -> str:
        if node.op is Op.REDUCE and node in self.row_values:
            return self._rounded(node, self._row_value(node, index))
        key = (node.id, index, mask)
        stage = self.stack[-1]
        if key in stage.memo:
            return stage.memo[key]
        if (node.id in self.scratch and mask is None and index == self._iter_index()
                and self._position(stage) > self.scratch_stage[node.id]):
            out = self._tmp()
            sc = self.scratch[node.id]
            self._emit(k.Load(out, sc.name, self._row_position(), sc.dtype))
            stage.memo[key] = out
            return out
        if self.use_scratch and mask is None and stage.loop and index == self._iter_index():
            kept = self._kept_from_earlier_stage(node, key, stage)
            if kept is not None:
                stage.memo[key] = kept
                return kept
        self._count_index(node, index)
        out = self._compute(node, index, mask)
        stage.memo[key] = out
        return out

    def _kept_from_earlier_stage(self, node: Node, key: tuple, stage: _StageBuilder) -> str | None:
        """A costly value an earlier loop stage computed at the same points: that stage keeps
        it in a row array and this one reads it back (a LayerNorm over a GELU computes the GELU
        once per element, not once per stage). None where no earlier stage computed it."""
        if node.id in self.scratch or len(self.scratch) >= KEPT_ROWS:
            return None
        position = self._position(stage)
        for q, earlier in enumerate(self.stages[:position]):
            if earlier.loop and key in earlier.memo:
                if not _costly(node, self.buffer_names, set()):
                    return None
                sc = k.Scratch(f"row{len(self.scratch)}", compute_dtype(node.dtype))
                earlier.body.append(k.Store(sc.name, self._row_position(), earlier.memo[key], sc.dtype))
                self.scratch[node.id] = sc
                self.scratch_stage[node.id] = q
                out = self._tmp()
                self._emit(k.Load(out, sc.name, self._row_position(), sc.dtype))
                return out
        return None

    def _count_index(self, node: Node, index: tuple[Expr, ...]) -> None:
        """A value inlined is computed once per index it is read at. Views that interleave
        views (a traced scan's levels) double that per level: past INDEX_VARIANT_LIMIT
        indices the value is stored instead, so that a kernel's source stays proportional
        to its graph, not to the data's extent."""
        if node in self.buffer_names or node.op in (Op.CONSTANT, Op.IOTA, Op.VIEW):
            return
        seen = self.indices_read.setdefault(node.id, set())
        seen.add(index)
        if len(seen) > INDEX_VARIANT_LIMIT:
            raise FusionMismatch(node, f"read at more than {INDEX_VARIANT_LIMIT} indices in one kernel: "
                                       f"stored instead of recomputed at each")

    def _compute(self, node: Node, index: tuple[Expr, ...], mask: str | None) -> str:
        if node in self.buffer_names and node not in self.plan.roots:
            out = self._tmp()
            buf = self._param(node, False)
            self._emit(k.Load(out, buf, self._linear(node, index), node.dtype, mask))
            return out
        op = node.op
        if op is Op.CONSTANT:
            out = self._tmp()
            self._emit(k.Const(out, node.attrs[0], node.dtype))
            return out
        if op is Op.IOTA:
            dim, start, step = node.attrs
            pos = self._tmp()
            self._emit(k.IndexValue(pos, index[dim]))
            out = pos
            if step != 1:
                out = self._binary("mul", out, self._const(step, torch.int64), torch.int64)
            if start != 0:
                out = self._binary("add", out, self._const(start, torch.int64), torch.int64)
            if node.dtype != torch.int64:
                out = self._cast(out, node.dtype)
            return out
        if op is Op.POINTWISE:
            args = tuple(self.value(i, index, mask) for i in node.inputs)
            if node.fn in INTEGER_DIVISIONS and not node.dtype.is_floating_point:
                self._check_divisor(args[1], mask)
            out = self._tmp()
            self._emit(k.Compute(out, node.fn, args, node.dtype))
            return out
        if op is Op.VIEW:
            index_map, valid, fill = node.attrs
            mapping = dict(zip(dim_syms(node.shape), index))
            src_index = tuple(ix.substitute(e, mapping) for e in index_map)
            # a check that holds at every point read here (a window's middle tap) is dropped
            checks = [(at, size) for at, size in ((ix.substitute(e, mapping), size) for e, size in valid)
                      if not _always_within(at, size)]
            if not checks:
                return self.value(node.inputs[0], src_index, mask)
            cond = None
            for at, size in checks:
                c = self._tmp()
                self._emit(k.InBounds(c, at, size))
                cond = c if cond is None else self._binary("logical_and", cond, c, torch.bool)
            inner_mask = cond if mask is None else self._binary("logical_and", mask, cond, torch.bool)
            v = self.value(node.inputs[0], src_index, inner_mask)
            filler = self._const(fill, node.dtype)
            out = self._tmp()
            self._emit(k.Compute(out, "where", (cond, v, filler), node.dtype))
            return out
        if op is Op.GATHER:
            index_map, rule = node.attrs
            src = node.inputs[0]
            mapping: dict[Sym, Expr] = dict(zip(dim_syms(node.shape), index))
            for j, idx_node in enumerate(node.inputs[1:]):
                v = self.value(idx_node, index, mask)
                mapping[value_sym(j)] = ix.as_expr(Sym(v))
            src_index = []
            for d, e in enumerate(index_map):
                e2 = ix.substitute(e, mapping)
                if any(s.extent is None for s in e2.symbols()):
                    inputs = [j for j in range(len(node.inputs) - 1) if value_sym(j) in e.symbols()]
                    check = Check(rule, d, src.shape[d], inputs[0] if inputs else 0)
                    e2 = ix.as_expr(self._checked_index(e2, check, mask))
                src_index.append(e2)
            return self.value(src, tuple(src_index), mask)
        if op is Op.REDUCE:
            return self._rounded(node, self._reduction(node, index))
        raise FusionMismatch(node, f"cannot inline {op.value} into a kernel")

    def _checked_index(self, e: Expr, check: Check, mask: str | None) -> Sym:
        """e as an index into a dimension of check.size, negatives counted from the end where
        the rule says so. Out of range, it is reported to the host (where mask holds and the
        rule reports) and read as 0, so that no access leaves the buffer."""
        raw = self._tmp()
        self._emit(k.IndexValue(raw, e))
        zero = self._const(0, torch.int64)
        index = raw
        if RULES[check.rule].wrap:
            neg = self._binary("lt", raw, zero, torch.bool)
            shifted = self._binary("add", raw, self._const(check.size, torch.int64), torch.int64)
            index = self._tmp()
            self._emit(k.Compute(index, "where", (neg, shifted, raw), torch.int64))
        below = self._binary("lt", index, zero, torch.bool)
        above = self._binary("ge", index, self._const(check.size, torch.int64), torch.bool)
        outside = self._binary("logical_or", below, above, torch.bool)
        if RULES[check.rule].reported:
            self._flag(outside, raw, check, mask)
        out = self._tmp()
        self._emit(k.Compute(out, "where", (outside, zero, index), torch.int64))
        return Sym(out, check.size) if check.size > 0 else Sym(out)

    def _check_divisor(self, divisor: str, mask: str | None) -> None:
        """An integer division by zero is reported to the host (the renderers' divisions
        return 0 there instead of trapping)."""
        zero = self._binary("eq", divisor, self._const(0, torch.int64), torch.bool)
        self._flag(zero, divisor, Check("divide_by_zero"), mask)

    def _flag(self, cond: str, value: str, check: Check, mask: str | None) -> None:
        if mask is not None:  # a masked-off point reads nothing and computes on zeros
            cond = self._binary("logical_and", cond, mask, torch.bool)
        self.checks.append(check)
        self._emit(k.Flag(cond, value, len(self.checks) - 1))

    def _const(self, value, dtype) -> str:
        key = ("const", value, dtype)
        stage = self.stack[-1]
        if key not in stage.memo:
            out = self._tmp()
            self._emit(k.Const(out, value, dtype))
            stage.memo[key] = out
        return stage.memo[key]

    def _binary(self, fn: str, a: str, b: str, dtype) -> str:
        out = self._tmp()
        self._emit(k.Compute(out, fn, (a, b), dtype))
        return out

    def _cast(self, a: str, dtype) -> str:
        out = self._tmp()
        self._emit(k.Compute(out, "cast", (a,), dtype))
        return out

    def _row_index(self) -> tuple[Expr, ...]:
        return tuple(ix.as_expr(s) + 0 for s in self.outer)  # "+ 0" simplifies: extent-1 dims are 0

    def _row_index_of(self, root: Node) -> tuple[Expr, ...]:
        """Index of a one-value-per-row root (its size-1 dims are 0, the others the rows')."""
        outer = iter(s for s in self.outer if s.extent != 1)
        return tuple(ix.as_expr(0) if n == 1 else ix.as_expr(next(outer)) for n in root.shape)

    def _row_value(self, node: Node, index: tuple[Expr, ...]) -> str:
        if tuple(index) != self._row_index():
            raise FusionMismatch(node, f"read at [{', '.join(map(str, index))}], not at its own row")
        return self.row_values[node]

    def _reduction(self, node: Node, index: tuple[Expr, ...]) -> str:
        if node.attrs[1] != self.plan.axes or node.inputs[0].shape != self.plan.iter_shape:
            raise FusionMismatch(node, "its row differs from the kernel's")
        if tuple(index) != self._row_index():
            raise FusionMismatch(node, f"read at [{', '.join(map(str, index))}], not at its own row")
        kind = node.attrs[0]
        src = node.inputs[0]
        below = reductions_below(node, self.read_buffers, nested=True)
        for r in below:
            if r not in self.row_values:
                self._reduction(r, self._row_index())
        stage = self._loop_stage_after(below)
        self.stack.append(self.stages[stage])
        v = self.value(src, self._iter_index())
        acc = self._tmp()
        position = self._row_position() if kind in ("argmax", "argmin") else None
        self._emit(k.Reduce(acc, kind, v, src.dtype, position))
        if self.use_scratch and self._worth_keeping(src) and src.id not in self.scratch:
            # later stages (softmax's normalization, a norm's second pass) read it back
            sc = k.Scratch(f"row{len(self.scratch)}", compute_dtype(src.dtype))
            self._emit(k.Store(sc.name, self._row_position(), v, sc.dtype))
            self.scratch[src.id] = sc
            self.scratch_stage[src.id] = stage
        self.stack.pop()
        self.row_values[node] = acc
        self.reduction_stage[node] = stage
        return acc

    def _rounded(self, node: Node, acc: str) -> str:
        """A reduction's result as its readers see it: a bf16/f16 sum or product accumulates
        in float32 and eager rounds the result to its dtype before anything reads it. Each
        stage rounds its own copy, so that no stage reads a value defined in another's loop."""
        if node.dtype not in (torch.bfloat16, torch.float16) or node.attrs[0] not in ROUNDED_REDUCTIONS:
            return acc
        stage = self.stack[-1]
        key = ("rounded", acc)
        if key not in stage.memo:
            stage.memo[key] = self._cast(acc, node.dtype)
        return stage.memo[key]

    def _position(self, stage: _StageBuilder) -> int:
        """Where stage runs: its index, or after all of them while it is being built."""
        for i, st in enumerate(self.stages):
            if st is stage:
                return i
        return len(self.stages)

    def _loop_stage_after(self, inputs: list[Node]) -> int:
        """The first loop stage that runs after the reductions in inputs (a reduction reads
        their results only once their loops are done), new if there is none: independent
        reductions over the same rows share one loop and its loads."""
        first = 1 + max((self.reduction_stage[r] for r in inputs), default=-1)
        for i in range(first, len(self.stages)):
            if self.stages[i].loop:
                return i
        self.stages.append(_StageBuilder(loop=True))
        return len(self.stages) - 1

    def _row_position(self) -> Expr:
        """Position within the reduction domain, row-major."""
        position = ix.as_expr(0)
        for s in self.reduce:
            position = position * s.extent + ix.as_expr(s)
        return position

    def _worth_keeping(self, node: Node) -> bool:
        """Anything beyond a plain load of a stored tensor costs more to recompute than to keep."""
        while node.op is Op.VIEW and not node.attrs[1] and node not in self.buffer_names:
            node = node.inputs[0]
        if node.op in (Op.CONSTANT, Op.IOTA):
            return False
        return self.keep_loaded_rows or node not in self.buffer_names

    # ------------------------------------------------------------------ kernel
    def build(self) -> k.Kernel:
        final = _StageBuilder(loop=True)
        row_stores: list[Node] = []
        for root in self.plan.roots:
            if root.op is Op.REDUCE or root.shape != self.plan.iter_shape:
                row_stores.append(root)
                continue
            # Reductions first, so that values they keep in row arrays are read, not recomputed.
            for r in reductions_below(root, self.read_buffers, nested=True):
                if r not in self.row_values:
                    self._reduction(r, self._row_index())
            self.stack.append(final)
            v = self.value(root, self._iter_index())
            self.stack.pop()
            index = self._linear(root, self._iter_index())
            final.body.append(k.Store(self._param(root, True), index, v, root.dtype))
        for root in row_stores:
            index = self._row_index() if root.op is Op.REDUCE else self._row_index_of(root)
            for r in (
                [root] if root.op is Op.REDUCE else reductions_below(root, self.read_buffers, nested=True)
            ):
                if r not in self.row_values:
                    self._reduction(r, self._row_index())
            row = _StageBuilder(loop=False)
            self.stack.append(row)
            v = self.row_values[root] if root.op is Op.REDUCE else self.value(root, index)
            self.stack.pop()
            row.body.append(k.Store(self._param(root, True), self._linear(root, index), v, root.dtype))
            self.stages.append(row)
        stages = tuple(k.Stage(st.loop, tuple(st.body)) for st in self.stages)
        if final.body:
            stages += (k.Stage(True, tuple(final.body)),)
        stages, scratch = _drop_unread_scratch(stages, tuple(self.scratch.values()))
        stages, checks = merge_common_values(stages, tuple(self.checks))
        stages, params, args = _positional_params(stages, self.params)
        if checks:
            params += (k.Param(ERROR_PARAM, torch.int64, True),)
            args += (ERROR_PARAM,)
        outer, reduce = _loop_orders(self.outer, self.reduce, stages, scratch)
        return k.Kernel(self.name, outer, reduce, params, stages, scratch, args, checks)


def _buffer_accesses(stages: tuple[k.Stage, ...],
                     scratch: tuple[k.Scratch, ...]) -> list[tuple[bool, k.Stmt]]:
    """(in a loop stage, statement) of each load and store of a buffer (not of a row array),
    stores first: a kernel writes in the order it iterates."""
    rows = {sc.name for sc in scratch}
    found = [(st.loop, s) for st in stages for s in st.body
             if isinstance(s, (k.Load, k.Store)) and s.buf not in rows]
    return [a for a in found if isinstance(a[1], k.Store)] + [a for a in found if isinstance(a[1], k.Load)]


def _loop_orders(outer, reduce, stages: tuple[k.Stage, ...], scratch: tuple[k.Scratch, ...]):
    """The outer and reduction loops in the memory order of the buffers they walk. An arg
    reduction keeps the logical order: its ties go to the first position it visits."""
    accesses = _buffer_accesses(stages, scratch)
    outer = iteration_order(outer, [s.index for _, s in accesses])
    if not any(isinstance(s, k.Reduce) and s.kind in ("argmax", "argmin") for st in stages for s in st.body):
        reduce = iteration_order(reduce, [s.index for loop, s in accesses if loop])
    return outer, reduce


def _positional_params(stages: tuple[k.Stage, ...], params: dict[str, k.Param]):
    """Name parameters by position (in0.., out0..) in order of first use, so that kernels
    computing the same thing on different buffers (the layers of a model) are the same
    source, compiled once. Returns the renamed stages, the params and the host buffers."""
    order: list[str] = []
    for st in stages:
        for s in st.body:
            if isinstance(s, (k.Load, k.Store)) and s.buf in params and s.buf not in order:
                order.append(s.buf)
    counts = {True: 0, False: 0}
    rename: dict[str, str] = {}
    for buf in order:
        out = params[buf].is_output
        rename[buf] = f"{'out' if out else 'in'}{counts[out]}"
        counts[out] += 1
    order.sort(key=lambda b: params[b].is_output)
    new_stages = tuple(
        k.Stage(
            st.loop,
            tuple(
                replace(s, buf=rename[s.buf]) if isinstance(s, (k.Load, k.Store)) and s.buf in rename else s
                for s in st.body
            ),
        )
        for st in stages
    )
    new_params = tuple(k.Param(rename[b], params[b].dtype, params[b].is_output) for b in order)
    return new_stages, new_params, tuple(order)


def _drop_unread_scratch(stages: tuple[k.Stage, ...], scratch: tuple[k.Scratch, ...]):
    """Row arrays no later stage reads are not worth their stores."""
    read = {s.buf for st in stages for s in st.body if isinstance(s, k.Load)}
    unread = {sc.name for sc in scratch} - read
    if not unread:
        return stages, scratch
    stages = tuple(
        k.Stage(st.loop, tuple(s for s in st.body if not (isinstance(s, k.Store) and s.buf in unread)))
        for st in stages
    )
    return stages, tuple(sc for sc in scratch if sc.name not in unread)


def emit_kernel(
    name: str,
    plan: KernelPlan,
    buffer_names: dict[Node, str],
    layouts,
    row_scratch_limit: int = 0,
    keep_loaded_rows: bool = False,
) -> k.Kernel:
    kernel = KernelEmitter(name, plan, buffer_names, layouts, row_scratch_limit, keep_loaded_rows).build()
    if kernel.scratch:
        # a reduction down columns walks blocks of neighbouring columns, where a row kept per
        # column does not fit: it reads its input again instead (walked column by column to
        # keep its rows, every load would be a new cache line)
        try:
            recomputing = KernelEmitter(name, plan, buffer_names, layouts, 0, keep_loaded_rows).build()
        except FusionMismatch:  # recomputing would read a value at too many indices: rows kept
            return kernel
        if k.column_reduction(recomputing):
            return recomputing
    return kernel


def transposing_copy(kernel: k.Kernel, plan: KernelPlan, buffer_names: dict[Node, str],
                     layouts) -> Decision | None:
    """A kernel whose buffers walk its points in different orders copies between layouts (one
    of its accesses is strided): which buffers, in which layouts, and why each has its own."""
    by_name = {name: node for node, name in buffer_names.items()}
    accesses = [(arg, s.index) for st in kernel.stages for s in st.body if isinstance(s, (k.Load, k.Store))
                for param, arg in zip(kernel.params, kernel.args) if param.name == s.buf]
    orders = access_orders(kernel.outer + kernel.reduce, accesses)
    if len(set(orders.values())) < 2:
        return None
    rows = kernel.reduce if kernel.reduce and not k.column_reduction(kernel) else kernel.outer
    innermost = [s for s in rows if s.extent != 1][-1]
    loops = kernel.outer + kernel.reduce
    steps = dict(reversed([(arg, step_along(e, innermost, loops)) for arg, e in accesses]))
    parts = []
    for name in orders:
        node = by_name[name]
        why = given_reason(node) if node.op in (Op.INPUT, Op.EXTERN, Op.ITEM) else layouts.choice(node).reason
        parts.append(f"{node_label(node)} {order_name(node.shape, layouts(node))} {list(node.shape)} "
                     f"({why}) steps {steps[name]} along the innermost loop")
    return Decision(node_label(plan.roots[0]), "transpose",
                    f"{kernel.name} copies between layouts: " + "; ".join(parts))


def _always_within(at: Expr, size) -> bool:
    """Whether 0 <= at < size at every point of the kernel's domain."""
    b = at.bounds()
    return b is not None and known_le(0, b[0]) and known_lt(b[1], size)


# math that costs more than a row array's store and load (a rounding to bf16/f16 included)
COSTLY_FUNCTIONS = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "erf", "erfc", "erfinv", "tanh", "sigmoid",
    "gelu", "gelu_tanh", "silu", "softplus", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "asinh", "acosh", "atanh", "pow", "sqrt", "rsqrt", "div"})


def _costly(node: Node, buffers: dict[Node, str], seen: set[Node]) -> bool:
    """Whether computing node inline (down to the buffers it loads) calls costly math; seen:
    the nodes already looked at (each once)."""
    if node in seen or node in buffers or node.op is not Op.POINTWISE:
        return False
    seen.add(node)
    fn = node.attrs[0]
    if fn in COSTLY_FUNCTIONS or (fn == "cast" and node.dtype in (torch.bfloat16, torch.float16)):
        return True
    return any(_costly(i, buffers, seen) for i in node.inputs)


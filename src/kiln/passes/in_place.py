"""Updates of graph inputs written in place, and results written over dead buffers.

AOTAutograd keeps each update of a graph input (an optimizer's parameters and states, a
norm's running statistics) as a `copy_(input, new_value)` at the end of the graph. Where it
is safe, the kernel computing the new value stores it straight into the input's memory: no
buffer for the new value, no copy. Otherwise the copy_ stays an ATen call after the outputs,
and a decision says why (the copy AOTAutograd would make otherwise: no op of the
program runs in ATen instead of a kernel).

Writing into an input is safe when
- the new value is stored by a kernel, with the input's shape, dtype and strides, and the
  input's elements do not overlap;
- no later step reads the input's old value, and the program returns neither the input nor
  the new value (the caller would get memory the next update overwrites);
- inside the kernel, every read of the input is at the element being written, before the
  write. A point-wise kernel stores all its results after all its loads to make it so.

The same rules let a point-wise kernel store a result into the memory of a buffer it reads and
no later step reads (a convolution's result under its norm and activation, a matmul's under its
bias and activation): a buffer of the program's own, neither returned nor viewed, of the
result's shape, dtype and strides. The program then holds one buffer where it held two.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kiln.ir import kernel as k
from kiln.ir.group import is_group
from kiln.ir.matmul import is_matmul
from kiln.ir.sizes import is_symbolic
from kiln.ir.tensor import ArgRef, Node, Op
from kiln.passes.fusion import Decision, KernelPlan, Schedule
from kiln.passes.layout import is_non_overlapping, node_label, same_strides

COPY_ = torch.ops.aten.copy_.default


@dataclasses.dataclass(frozen=True)
class InputUpdate:
    """copy_(target, value) of a graph input, as the schedule holds it."""

    step: Node  # the copy_ call
    target: Node  # the graph input
    value: Node  # its new value


def input_updates(sched: Schedule) -> list[InputUpdate]:
    found = []
    for step in sched.steps:
        if isinstance(step, KernelPlan) or step.op is not Op.EXTERN or step.attrs[0] is not COPY_:
            continue
        args = step.attrs[1]
        if len(args) != 2 or not all(isinstance(a, ArgRef) for a in args):
            continue
        target, value = (step.inputs[a.index] for a in args)
        if target.op is Op.INPUT and target not in sched.aliases:
            found.append(InputUpdate(step, target, value))
    return found


def schema_may_alias(target) -> bool:
    """Whether an ATen op's result may share memory with its arguments (per its schema; an op
    without one may)."""
    schema = getattr(target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def name_owners(names: dict[Node, str]) -> dict[str, Node]:
    """The node whose memory each buffer name is: a kernel storing an input's update, or a
    result written over a dead buffer, is named as that input or buffer; the input, else the
    first node of a name, owns it."""
    owners: dict[str, Node] = {}
    for node, name in names.items():
        if node.op is not Op.INPUT:
            owners.setdefault(name, node)
    owners.update({name: node for node, name in names.items() if node.op is Op.INPUT})
    return owners


def _base(n: Node, sched: Schedule) -> Node:
    return sched.aliases[n].base if n in sched.aliases else n


def output_memory(sched: Schedule) -> set[Node]:
    """The nodes whose memory the program's outputs may be in: the outputs, and what they
    view or alias, through views, aliases and ATen calls that may return a view."""
    seen: set[Node] = set()
    stack = [o for o in sched.graph.outputs if isinstance(o, Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in sched.aliases:
            stack.append(sched.aliases[n].base)
        call = n if n.op is Op.EXTERN else n.inputs[0] if n.op is Op.ITEM else None
        may_alias = call is not None and schema_may_alias(call.attrs[0])
        if n.op is Op.VIEW or may_alias:
            stack.extend(n.inputs if n.op is not Op.ITEM else call.inputs)
    return seen


def _step_reads(step, kernels: dict[int, k.Kernel], by_name: dict[str, Node], sched: Schedule) -> set[Node]:
    if isinstance(step, KernelPlan):
        kern = kernels[id(step)]
        return {by_name[a] for a, p in zip(kern.args, kern.params) if a in by_name and not p.is_output}
    return {_base(i, sched) for i in step.inputs}


def _static_problem(u: InputUpdate, sched: Schedule, kernels, by_name, layouts, writer) -> str | None:
    """Why the update cannot be written in place, judged on the schedule; None if it can."""
    target, value = u.target, u.value
    if writer is None:
        return "its new value is not computed by a kernel (an input, a view or an ATen result)"
    if value.shape != target.shape or value.dtype != target.dtype:
        return "copy_ broadcasts or converts the new value"
    if not is_non_overlapping(target.shape, tuple(target.attrs[1])):
        return "the input's elements overlap"
    if not same_strides(target.shape, tuple(layouts(value)), tuple(target.attrs[1])):
        return "the new value's layout differs from the input's"
    if {target, value, u.step} & output_memory(sched):
        return "the program returns the input's memory or its new value"
    steps = sched.steps
    for later in steps[steps.index(writer) + 1:]:
        if later is u.step:
            continue
        reads = _step_reads(later, kernels, by_name, sched)
        if any(i is u.step for i in getattr(later, "inputs", ())) or target in reads:
            label = node_label(later.roots[0]) if isinstance(later, KernelPlan) else node_label(later)
            return f"{label} reads the input's old value after the kernel computing its new value"
    return None


def _stores_after_loads(kern: k.Kernel) -> k.Kernel:
    """A point-wise kernel with every store after every load: without a reduction domain each
    stage runs once per point, so the statements of all stages may run as one, stores last."""
    if kern.reduce or not kern.stages:
        return kern
    body = [s for st in kern.stages for s in st.body]
    stores = tuple(s for s in body if isinstance(s, k.Store))
    ordered = tuple(s for s in body if not isinstance(s, k.Store)) + stores
    return dataclasses.replace(kern, stages=(k.Stage(kern.stages[0].loop, ordered),))


def _kernel_problem(kern: k.Kernel, buffer: str) -> str | None:
    """Why the kernel's reads of buffer, which it also writes, are unsafe; None if they are safe:
    each read is at the one index written, and comes before the write."""
    param = next(p.name for p, a in zip(kern.params, kern.args) if a == buffer)
    stmts = [s for st in kern.stages for s in st.body]
    stores = [i for i, s in enumerate(stmts) if isinstance(s, k.Store) and s.buf == param]
    if len(stores) != 1:
        return "the kernel writes the input more than once"
    store = stmts[stores[0]]
    for i, s in enumerate(stmts):
        if isinstance(s, k.Load) and s.buf == param:
            if s.index != store.index:
                return f"the kernel reads the input at {s.index} while writing {store.index}"
            if i > stores[0]:
                return "the kernel reads the input after writing it"
    return None


def write_in_place(sched: Schedule, kernels: dict[int, k.Kernel], names: dict[Node, str],
                   layouts) -> list[Decision]:
    """Rewrite sched, kernels and names (in place) so that each safe input update is stored by
    its kernel into the input. One decision per update."""
    updates = input_updates(sched)
    if not updates or any(is_symbolic(s) for u in updates for s in u.target.shape):
        return []  # a shape family's updates (a static KV cache's) stay copies after the kernels
    by_name = {name: node for node, name in names.items()}
    old_names = dict(names)
    writers = {r: step for step in sched.steps if isinstance(step, KernelPlan) for r in step.roots}
    verdicts: dict[InputUpdate, str | None] = {}
    renamed_values: set[Node] = set()
    for u in updates:
        problem = _static_problem(u, sched, kernels, by_name, layouts, writers.get(u.value))
        if problem is None and (u.value in renamed_values or u.target in {v.target for v in verdicts}):
            problem = "another update already writes this value or this input"
        verdicts[u] = problem
        if problem is None:
            renamed_values.add(u.value)
    # each kernel stores its new values into the inputs; what turns out unsafe inside its
    # kernel is undone, and the rest tried again
    by_writer: dict[int, list[InputUpdate]] = {}
    for u, problem in verdicts.items():
        if problem is None:
            by_writer.setdefault(id(writers[u.value]), []).append(u)
    for plan_id, group in by_writer.items():
        while group:
            kern = kernels[plan_id]
            for u in group:
                kern = _stored_as(kern, names[u.value], names[u.target])
            kern = _stores_after_loads(kern)
            unsafe = [u for u in group if _kernel_problem(kern, names[u.target]) is not None]
            for u in unsafe:
                verdicts[u] = _kernel_problem(kern, names[u.target])
            if not unsafe:
                kernels[plan_id] = kern
                names.update({u.value: names[u.target] for u in group})
                break
            group = [u for u in group if u not in unsafe]
    # the other kernels read each new value where it now is
    moved = {old_names[u.value]: names[u.value] for u, problem in verdicts.items() if problem is None}
    for key, kern in kernels.items():
        if moved.keys() & set(kern.args):
            kernels[key] = dataclasses.replace(kern, args=tuple(moved.get(a, a) for a in kern.args))
    done = {id(u.step) for u, problem in verdicts.items() if problem is None}
    sched.steps[:] = [s for s in sched.steps if id(s) not in done]
    gone = {f"{node_label(u.step)} {u.step.attrs[0]}" for u, problem in verdicts.items() if problem is None}
    sched.decisions[:] = [d for d in sched.decisions if not (d.verdict == "extern" and d.node in gone)]
    return [
        Decision(node_label(u.target), "in place", f"the kernel computing {node_label(u.value)} stores it "
                 "into the input's memory") if problem is None else
        Decision(node_label(u.target), "copied back", f"its update stays a copy_ after the outputs: "
                 f"{problem}")
        for u, problem in verdicts.items()
    ]


def _fresh_memory(n: Node, sched: Schedule) -> bool:
    """Whether n's buffer is memory of its own: a kernel's result, or an ATen result that is
    no view of its arguments."""
    if n in sched.aliases or n.op in (Op.INPUT, Op.ITEM):
        return False
    return n.op is not Op.EXTERN or not schema_may_alias(n.attrs[0])


def _same_memory_shape(root: Node, b: Node, sched: Schedule, layouts) -> bool:
    """Whether root may take b's memory as it is: b's own memory, of root's dtype and layout."""
    stride = layouts(b)
    return (_fresh_memory(b, sched) and b.shape == root.shape and b.dtype == root.dtype
            and stride is not None and same_strides(root.shape, stride, layouts(root))
            and is_non_overlapping(root.shape, tuple(stride)))


def _stored_into(kern: k.Kernel, result: str, buffer: str) -> k.Kernel:
    """kern storing into buffer (one it reads) what it stored into result: one parameter
    fewer, the buffer's now an output."""
    params = dict(zip(kern.args, kern.params))
    out, into = params[result].name, params[buffer].name
    stages = tuple(k.Stage(st.loop, tuple(dataclasses.replace(s, buf=into) if isinstance(s, k.Store)
                                          and s.buf == out else s for s in st.body))
                   for st in kern.stages)
    kept = [(dataclasses.replace(p, is_output=True) if p.name == into else p, a)
            for p, a in zip(kern.params, kern.args) if p.name != out]
    return dataclasses.replace(kern, stages=stages, params=tuple(p for p, _ in kept),
                               args=tuple(a for _, a in kept))


def _stored_as(kern: k.Kernel, result: str, buffer: str) -> k.Kernel:
    """kern storing into buffer what it stored into result: into the parameter it reads buffer
    through if it has one (parameters never alias each other), else through result's own."""
    if buffer in kern.args:
        return _stored_into(kern, result, buffer)
    return dataclasses.replace(kern, args=tuple(buffer if a == result else a for a in kern.args))


def write_over_dead_buffers(sched: Schedule, kernels: dict[int, k.Kernel], names: dict[Node, str],
                            layouts) -> list[Decision]:
    """Let a point-wise kernel store a result into the memory of a buffer it reads and no
    later step reads (a convolution's result under its norm and activation): the program then
    holds one buffer where it held two. Rewrites sched's kernels and names (in place); one
    decision per buffer written over."""
    viewed = {a.base for a in sched.aliases.values()}
    returned = output_memory(sched)
    owner = name_owners(names)  # a result named as an input (its update) has no memory of its own
    last_reader: dict[Node, int] = {}
    for i, step in enumerate(sched.steps):
        for n in _step_reads(step, kernels, owner, sched):
            last_reader[n] = i
    decisions, taken, moved = [], set(), {}
    for i, step in enumerate(sched.steps):
        kern = kernels.get(id(step)) if isinstance(step, KernelPlan) else None
        if kern is None or kern.reduce or is_matmul(kern) or is_group(kern):
            continue
        reads = [(a, owner[a]) for a, p in zip(kern.args, kern.params) if not p.is_output and a in owner]
        for root in step.roots:
            if owner[names[root]] is not root or names[root] not in kern.args or root in returned \
                    or root in viewed or is_symbolic(math.prod(root.shape)):
                continue
            for arg, b in reads:
                if (b in taken or b in returned or b in viewed or last_reader.get(b) != i
                        or not _same_memory_shape(root, b, sched, layouts)):
                    continue
                candidate = _stores_after_loads(_stored_into(kern, names[root], arg))
                if _kernel_problem(candidate, arg) is None:
                    kern = kernels[id(step)] = candidate
                    taken.add(b)
                    moved[names[root]] = names[b]
                    names[root] = names[b]
                    decisions.append(Decision(node_label(root), "written over", "stored into the memory "
                                              f"of {node_label(b)}, which no later step reads"))
                    break
    for key, kern in kernels.items():  # later kernels read each result where it now is
        if moved.keys() & set(kern.args):
            kernels[key] = dataclasses.replace(kern, args=tuple(moved.get(a, a) for a in kern.args))
    return decisions

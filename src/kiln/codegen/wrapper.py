"""The host program: Python source that allocates buffers, calls kernels and ATen ops in
schedule order, reuses the memory of buffers that are no longer needed, and returns the
outputs with eager's sizes, strides and dtypes.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kiln import errors
from kiln.ir.checks import ERROR_PARAM, INDEX_RULES, SLOTS_PER_CHECK, Check
from kiln.ir.kernel import Kernel
from kiln.ir.tensor import ArgRef, Node, Op
from kiln.passes.fusion import KernelPlan, Schedule
from kiln.passes.layout import is_non_overlapping, same_strides


@dataclass
class HostProgram:
    source: str
    globals: dict[str, Any] = field(default_factory=dict)

    def load(self) -> Callable[[list], list]:
        scope = dict(self.globals)
        exec(compile(self.source, "<kiln host program>", "exec"), scope)
        return scope["call"]


def _may_alias_inputs(node: Node) -> bool:
    """Whether an ATen call's result may share memory with its arguments (per its schema)."""
    target = node.attrs[0] if node.op is Op.EXTERN else node.inputs[0].attrs[0]
    schema = getattr(target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _arena(slots: list[tuple], device: torch.device) -> Callable[[], list]:
    """Per-thread storage for the temporaries' slots, allocated on a thread's first call."""
    local = threading.local()

    def get() -> list:
        storage = getattr(local, "slots", None)
        if storage is None:
            storage = local.slots = [torch.empty(max(extent, 1), dtype=dtype, device=device)
                                     for dtype, extent in slots]
        return storage

    return get


def _has_ref(a) -> bool:
    if isinstance(a, ArgRef):
        return True
    return isinstance(a, (list, tuple)) and any(_has_ref(x) for x in a)


def _extern_call(node: Node, argnames: list[str], g: dict[str, Any]) -> str:
    """Python source calling the ATen op directly: tensor arguments by name, everything
    else as a constant of the program (no per-call argument rebuilding)."""
    target, args_t, kwargs_t = node.attrs[0], node.attrs[1], node.attrs[2]

    def render(a) -> str:
        if isinstance(a, ArgRef):
            return argnames[a.index]
        if isinstance(a, (list, tuple)) and _has_ref(a):
            inner = ", ".join(render(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner},)"
        if a is None or isinstance(a, (bool, int, str)):
            return repr(a)
        name = f"const{len(g)}"
        g[name] = a
        return name

    fname = f"op{node.id}"
    g[fname] = target
    parts = [render(a) for a in args_t] + [f"{k}={render(v)}" for k, v in kwargs_t.items()]
    return f"{fname}({', '.join(parts)})"


def _restride(t: torch.Tensor, stride: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
    """An ATen result in the layout (and dtype: some ATen kernels return another dtype than
    their meta function says) kernels were compiled for, in new memory. A layout that repeats
    elements along stride-0 dims (a broadcast) is filled from one slice along them and expanded:
    no copy can write one element twice."""
    if len(stride) != t.dim():
        raise errors.MetaMismatch(f"an ATen op returned a {t.dim()}-d result of shape {tuple(t.shape)} "
                                  f"where PyTorch's shape function gives {len(stride)} dims")
    dtype = dtype or t.dtype
    broadcast = [d for d, (n, st) in enumerate(zip(t.shape, stride)) if st == 0 and n > 1]
    if broadcast:
        one = t[tuple(slice(0, 1) if d in broadcast else slice(None) for d in range(t.dim()))]
        return _restride(one, stride, dtype).expand(t.shape)
    out = torch.empty_strided(t.shape, stride, dtype=dtype, device=t.device)
    out.copy_(t)
    return out


def _copy_memory(t: torch.Tensor) -> torch.Tensor:
    """A copy of the memory t spans, in t's layout (overlapping strides included), so that
    views of t rebuilt on it from t's strides and offsets address the same values."""
    flat = torch.as_strided(t, (_extent(t.shape, t.stride()),), (1,), t.storage_offset()).clone()
    return torch.as_strided(flat, t.shape, t.stride(), 0)


def _raise_reported(errors: torch.Tensor, checks: list[Check]) -> None:
    """Raise what the first check that reported an error says, as eager would have."""
    for check, (flag, value) in zip(checks, errors.view(-1, SLOTS_PER_CHECK).tolist()):
        if flag:
            raise check.error(value)


def _checks_message(checks: list[Check]) -> str:
    return "kiln: a run-time check failed in a compiled program (" + ", ".join(map(str, checks)) + ")"


def _error_checks(schedule: Schedule, kernels: dict[int, Kernel]) -> tuple[list[Check], dict[int, int]]:
    """The checks of all launched kernels in launch order, and where each kernel's part of the
    program's error buffer starts (in int64 slots)."""
    checks: list[Check] = []
    offsets: dict[int, int] = {}
    for step in schedule.steps:
        kern = kernels.get(id(step)) if isinstance(step, KernelPlan) else None
        if kern is not None and kern.checks and kern.outer_numel > 0:
            offsets[id(step)] = SLOTS_PER_CHECK * len(checks)
            checks.extend(kern.checks)
    return checks, offsets


def _error_arg(kern: Kernel, offset: int, pass_pointers: bool) -> str:
    if pass_pointers:
        return f"errors.data_ptr() + {offset * 8}"
    return f"errors[{offset}:{offset + SLOTS_PER_CHECK * len(kern.checks)}]"


def _checked_layout(name: str, stride: tuple, dtype: torch.dtype) -> str:
    return (f"    if {name}.stride() != {stride} or {name}.dtype != {dtype}: "
            f"{name} = restride({name}, {stride}, {dtype})")


def build_host_program(schedule: Schedule, kernels: dict[int, Kernel], buffer_names: dict[Node, str],
                       layouts, device: torch.device, pass_pointers: bool = True) -> HostProgram:
    graph = schedule.graph
    g: dict[str, Any] = {"torch": torch, "empty_strided": torch.empty_strided, "device": device,
                         "as_strided": torch.as_strided, "restride": _restride, "copy_memory": _copy_memory,
                         "same_strides": same_strides}
    lines = ["def call(args):"]
    names = [f"arg{i}" for i in range(graph.num_inputs)]
    if names:
        lines.append(f"    {', '.join(names)}, = args")
    lines.append("    args.clear()")
    checks, error_offsets = _error_checks(schedule, kernels)
    if checks:
        g.update(zeros=torch.zeros, raise_reported=_raise_reported, checks=checks)
        lines.append(f"    errors = zeros({SLOTS_PER_CHECK * len(checks)}, dtype=torch.int64, device=device)")

    # Last step at which each buffer is read, to free or reuse it afterwards.
    outputs = set(graph.output_nodes())
    outputs |= {schedule.aliases[o].base for o in graph.output_nodes() if o in schedule.aliases}
    last_use: dict[Node, int] = {}
    reads_by_step: list[set[Node]] = []
    for k, step in enumerate(schedule.steps):
        reads = _step_reads(step, schedule, kernels, buffer_names)
        reads_by_step.append(reads)
        for r in reads:
            last_use[r] = k
    # Kernels and strided views read ATen results with the strides PyTorch's shape functions
    # promise; a few ops return another layout at run time, so those results are checked.
    layout_checked = {r for k, step in enumerate(schedule.steps) if isinstance(step, KernelPlan)
                       for r in reads_by_step[k]}
    layout_checked |= {a.base for a in schedule.aliases.values()}
    # An ATen op that may return a view of its argument keeps that memory alive: it is never
    # handed out again.
    extern_aliased = {r for k, step in enumerate(schedule.steps) if not isinstance(step, KernelPlan)
                      and _may_alias_inputs(step) for r in reads_by_step[k]}
    # Temporaries (kernel outputs nobody keeps) live in slots: a dead one's slot is reused by
    # the next of the same size. On the CPU the slots themselves persist across calls (one
    # set per thread), so temporaries cost no allocation and no page faults.
    slots: list[tuple] = []
    free_slots: dict[tuple, list[int]] = {}
    slot_of: dict[Node, int] = {}
    holder: dict[int, str] = {}
    use_arena = device.type == "cpu"

    def alloc(node: Node) -> str:
        name = buffer_names[node]
        stride = layouts(node)
        key = (node.dtype, _extent(node.shape, stride))
        if node in outputs or node in extern_aliased:
            lines.append(f"    {name} = empty_strided({node.shape}, {stride}, dtype={node.dtype}, "
                         f"device=device)")
            return name
        if free_slots.get(key):
            slot = free_slots[key].pop()
        else:
            slot = len(slots)
            slots.append(key)
        slot_of[node] = slot
        if use_arena:
            lines.append(f"    {name} = as_strided(arena[{slot}], {node.shape}, {stride})")
        elif slot in holder:
            reused = holder[slot]
            lines.append(f"    {name} = as_strided({reused}, {node.shape}, {stride})  # reuses {reused}")
        else:
            lines.append(f"    {name} = empty_strided({node.shape}, {stride}, dtype={node.dtype}, "
                         f"device=device)")
        holder[slot] = name
        return name

    by_name = {name: node for node, name in buffer_names.items()}
    for k, step in enumerate(schedule.steps):
        if isinstance(step, KernelPlan):
            kern = kernels[id(step)]
            for root in step.roots:
                alloc(root)
            if kern.outer_numel > 0:  # an empty output needs no kernel
                g[kern.name] = None  # filled in with the compiled function
                buffers = [a for a in kern.args if a != ERROR_PARAM]
                if pass_pointers:
                    ptrs = [f"{a}.data_ptr()" for a in buffers]
                else:
                    ptrs = list(buffers)
                if kern.checks:
                    ptrs.append(_error_arg(kern, error_offsets[id(step)], pass_pointers))
                if pass_pointers or any(_may_be_unaligned(by_name[a]) for a in buffers):
                    lines.append(f"    {kern.name}({', '.join(ptrs)})")
                else:
                    lines.append(f"    {kern.name}.aligned({', '.join(ptrs)})")
        elif step.op is Op.EXTERN:
            argnames = []
            for i in step.inputs:
                if i in schedule.aliases:
                    lines.append(f"    view{i.id} = {_alias_expr(schedule.aliases[i], buffer_names)}")
                    argnames.append(f"view{i.id}")
                else:
                    argnames.append(buffer_names[i])
            name = buffer_names[step]
            lines.append(f"    {name} = {_extern_call(step, argnames, g)}")
            if step.attrs[5] and step in layout_checked:
                stride = layouts(step)
                lines.append(_checked_layout(name, stride, step.dtype))
        elif step.op is Op.ITEM:
            name = buffer_names[step]
            lines.append(f"    {name} = {buffer_names[step.inputs[0]]}[{step.attrs[0]}]")
            if step in layout_checked:
                stride = layouts(step)
                lines.append(_checked_layout(name, stride, step.dtype))
        # release what this step read for the last time; inputs too: with the boxed calling
        # convention (args.clear() above) a backward's saved activations are freed here, one
        # layer at a time, instead of when the whole backward returns
        for r in sorted(reads_by_step[k], key=lambda n: n.id):
            if last_use.get(r) == k and r not in outputs:
                if r in slot_of:
                    free_slots.setdefault(slots[slot_of[r]], []).append(slot_of[r])
                else:
                    lines.append(f"    del {buffer_names[r]}")
    rets = []
    returned: set[Node] = set()
    fresh = graph.output_fresh or [False] * len(graph.outputs)
    eager_strides = graph.output_strides or [None] * len(graph.outputs)
    storage = graph.output_storage or [None] * len(graph.outputs)
    copies: dict[tuple[int, Node], str] = {}
    for position, o in enumerate(graph.outputs):
        want = eager_strides[position]
        owner = _input_memory(o, schedule) if isinstance(o, Node) else None
        if owner is not None and storage[position] is not None:
            # eager's output is in memory the graph allocated; kiln's is in an input's (a cat
            # with an empty part, a clone): return it from one copy per memory eager has, so
            # that a later update of the input does not show and views of it stay views
            key = (storage[position], owner)
            if key not in copies:
                copies[key] = f"copy{len(copies)}"
                lines.append(f"    {copies[key]} = copy_memory({buffer_names[owner]})")
            names = {**buffer_names, owner: copies[key]}
            if o is owner:  # restriding it below must not move the views of the copy
                lines.append(f"    out{position} = {copies[key]}")
                names[owner] = f"out{position}"
            rets.append(_in_eager_layout(o, want, schedule, names, layouts, lines))
        elif isinstance(o, Node) and fresh[position] and _shares_memory(o, schedule, returned):
            # eager returns new memory here; the value kiln has is an input, a view or
            # another output, so copy it (in eager's layout)
            stride = want if want is not None and is_non_overlapping(o.shape, want) else layouts(o)
            alias = schedule.aliases.get(o)
            source = _alias_expr(alias, buffer_names) if alias else buffer_names[o]
            rets.append(f"restride({source}, {stride})")
        elif isinstance(o, Node):
            rets.append(_in_eager_layout(o, want, schedule, buffer_names, layouts, lines))
        else:
            g_name = f"const{len(g)}"
            g[g_name] = o
            rets.append(g_name)
        if isinstance(o, Node):
            returned.add(o)
    if checks:
        if device.type == "cuda":
            # eager's CUDA kernels assert on the device, asynchronously: reading the errors on
            # the host would wait for every kernel at every call (and cannot be captured).
            # They check indices only: an integer division by zero does not stop them.
            rows = [r for r, c in enumerate(checks) if c.rule in INDEX_RULES]
            if rows:
                g.update(assert_async=torch._assert_async, checks_message=_checks_message(checks),
                         index_flags=torch.tensor([SLOTS_PER_CHECK * r for r in rows], device=device))
                lines.append("    assert_async(errors[index_flags].eq(0).all(), checks_message)")
        else:  # one read of the errors per call, after all launches
            lines.append("    if errors.any():")
            lines.append("        raise_reported(errors, checks)")
    lines.append(f"    return [{', '.join(rets)}]")
    if use_arena and slots:
        g["arena_for_thread"] = _arena(slots, device)
        lines.insert(lines.index("    args.clear()") + 1, "    arena = arena_for_thread()")
    return HostProgram("\n".join(lines) + "\n", g)


def _in_eager_layout(o: Node, want: tuple | None, schedule: Schedule, buffer_names, layouts,
                     lines: list[str]) -> str:
    """An output as an expression with eager's strides exactly: AOTAutograd regenerates
    views from them, and a backward compiled for them reads the tensors saved for it."""
    alias = schedule.aliases.get(o)
    expr = _alias_expr(alias, buffer_names) if alias else buffer_names[o]
    if want is None or len(want) != len(o.shape):
        return expr
    want = tuple(want)
    if o.op in (Op.EXTERN, Op.ITEM) and not alias:
        if not is_non_overlapping(o.shape, want):
            return expr
        # an ATen result's strides are known only at run time
        lines.append(f"    if {expr}.stride() != {want}: {expr} = "
                     f"as_strided({expr}, {o.shape}, {want}, {expr}.storage_offset()) "
                     f"if same_strides({o.shape}, {expr}.stride(), {want}) else restride({expr}, {want})")
        return expr
    have = alias.stride if alias else layouts(o)
    if have == want:
        return expr
    if same_strides(o.shape, have, want):  # differs only where no element is addressed
        return f"as_strided({expr}, {o.shape}, {want}, {expr}.storage_offset())"
    return f"restride({expr}, {want})" if is_non_overlapping(o.shape, want) else expr


def _alias_expr(a, buffer_names) -> str:
    base = buffer_names[a.base]
    # an empty view addresses nothing: its offset (a flip's n - 1 of a size-0 dim is -1) must
    # only stay within the storage
    offset = a.offset if math.prod(a.shape) else 0
    return f"as_strided({base}, {a.shape}, {a.stride}, {base}.storage_offset() + {offset})"


def _shares_memory(node: Node, schedule: Schedule, returned: set[Node]) -> bool:
    """Whether returning node's buffer as is would share memory with an input, with an
    earlier output, or with another tensor it is a view of."""
    if node in returned or node in schedule.aliases:
        return True
    return node.op is Op.INPUT or (node.op in (Op.EXTERN, Op.ITEM) and _extern_may_alias(node))


def _input_memory(node: Node, schedule: Schedule) -> Node | None:
    """The input, or the ATen view of one, whose memory node is in; None if node is in memory
    the program allocated."""
    base = schedule.aliases[node].base if node in schedule.aliases else node
    if base.op is Op.INPUT:
        return base
    if base.op in (Op.EXTERN, Op.ITEM) and _extern_may_alias(base):
        sources = base.inputs if base.op is Op.EXTERN else base.inputs[0].inputs
        if any(_input_memory(i, schedule) is not None for i in sources):
            return base
    return None


def _may_be_unaligned(node: Node) -> bool:
    """Whether a buffer may start off a 16-byte boundary: a caller's tensor or an ATen view
    may; memory the host program allocates, or an ATen op returns new, does not."""
    return node.op is Op.INPUT or (node.op in (Op.EXTERN, Op.ITEM) and _may_alias_inputs(node))


def _extern_may_alias(node: Node) -> bool:
    target = node.attrs[0] if node.op is Op.EXTERN else node.inputs[0].attrs[0]
    return bool(getattr(target, "is_view", False))


def _extent(shape, stride) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def _step_reads(step, schedule: Schedule, kernels, buffer_names) -> set[Node]:
    if isinstance(step, KernelPlan):
        kern = kernels[id(step)]
        by_name = {v: n for n, v in buffer_names.items()}
        return {by_name[a] for a, p in zip(kern.args, kern.params) if not p.is_output}
    reads = set()
    for i in step.inputs:
        reads.add(schedule.aliases[i].base if i in schedule.aliases else i)
    return reads

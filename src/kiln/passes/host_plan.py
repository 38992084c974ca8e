"""The host program of a schedule (ir/host.py): buffers allocated, kernels launched and ATen
ops called in schedule order, then the outputs with eager's sizes, strides, dtypes and
memory. Every kernel output gets new memory here; passes/memory.py then frees and reuses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import torch

from kiln.frontend.user_triton import UserKernelCall
from kiln.ir.checks import ERROR_PARAM, SLOTS_PER_CHECK, Check
from kiln.ir.host import (
    Alloc,
    CallAten,
    CheckErrors,
    ConstRef,
    CopyMemory,
    EagerLayout,
    EnsureLayout,
    HostProgram,
    InputSpec,
    Instr,
    Item,
    Launch,
    LaunchUser,
    Ref,
    Restride,
    Return,
    SizeBinding,
    View,
    canonical,
    is_literal,
    op_name,
)
from kiln.ir.kernel import Kernel, kernel_str, size_params
from kiln.ir.sizes import NeedsNumber, symbols
from kiln.ir.tensor import ArgRef, Node, Op
from kiln.passes.fusion import Alias, KernelPlan, Schedule
from kiln.passes.in_place import input_updates, name_owners, output_memory, schema_may_alias
from kiln.passes.layout import is_non_overlapping, same_strides


class _Builder:
    def __init__(self, schedule: Schedule, buffer_names: dict[Node, str], layouts):
        self.schedule, self.names, self.layouts = schedule, buffer_names, layouts
        self.body: list[Instr] = []
        self.constants: dict[str, Any] = {}

    def constant(self, value: Any, prefix: str = "const") -> ConstRef:
        for name, held in self.constants.items():
            if held is value:
                return ConstRef(name)
        name = f"{prefix}{len(self.constants)}"
        self.constants[name] = value
        return ConstRef(name)

    def literal(self, a: Any, argnames: list[str]) -> Any:
        """An ATen argument as program data: tensors by name, tensor constants and objects
        no literal can write as named constants."""
        if isinstance(a, ArgRef):
            return Ref(argnames[a.index])
        if isinstance(a, list):
            return [self.literal(x, argnames) for x in a]
        if isinstance(a, tuple):
            return tuple(self.literal(x, argnames) for x in a)
        return canonical(a) if is_literal(a) else self.constant(a)

    def view(self, out: str, a: Alias, names: dict[Node, str]) -> str:
        # an empty view addresses nothing: its offset (a flip's n - 1 of a size-0 dim is -1)
        # must only stay within the storage
        offset = a.offset if math.prod(a.shape) else 0
        self.body.append(View(out, names[a.base], a.shape, a.stride, offset))
        return out


def _may_alias_inputs(node: Node) -> bool:
    """Whether an ATen call's result may share memory with its arguments (per its schema)."""
    return schema_may_alias(node.attrs[0] if node.op is Op.EXTERN else node.inputs[0].attrs[0])


def _extern_may_alias(node: Node) -> bool:
    target = node.attrs[0] if node.op is Op.EXTERN else node.inputs[0].attrs[0]
    return bool(getattr(target, "is_view", False))


def _may_be_unaligned(node: Node) -> bool:
    """Whether a buffer may start off a 16-byte boundary: a caller's tensor or an ATen view
    may; memory the host program allocates, or an ATen op returns new, does not."""
    return node.op is Op.INPUT or (node.op in (Op.EXTERN, Op.ITEM) and _may_alias_inputs(node))


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


def _step_reads(step, schedule: Schedule, kernels, by_name: dict[str, Node]) -> set[Node]:
    if isinstance(step, KernelPlan):  # an output it is not the first node of holds a value read
        kern = kernels[id(step)]
        return {by_name[a] for a, p in zip(kern.args, kern.params)
                if a in by_name and (not p.is_output or by_name[a] not in step.roots)}
    return {schedule.aliases[i].base if i in schedule.aliases else i for i in step.inputs}


def kernel_digest(kern: Kernel) -> str:
    return hashlib.sha256(kernel_str(kern).encode()).hexdigest()[:16]


def build_host_program(schedule: Schedule, kernels: dict[int, Kernel], buffer_names: dict[Node, str],
                       layouts, device: torch.device, pass_pointers: bool = True) -> HostProgram:
    """The host program, before memory planning."""
    graph = schedule.graph
    b = _Builder(schedule, buffer_names, layouts)
    by_name = name_owners(buffer_names)
    checks, error_offsets = _error_checks(schedule, kernels)
    reads_by_step = [_step_reads(s, schedule, kernels, by_name) for s in schedule.steps]
    # Kernels and strided views read ATen results with the strides PyTorch's shape functions
    # promise; a few ops return another layout at run time, so those results are checked.
    layout_checked = {r for step, reads in zip(schedule.steps, reads_by_step) if isinstance(step, KernelPlan)
                      for r in reads}
    layout_checked |= {a.base for a in schedule.aliases.values()}
    launched: dict[str, str] = {}
    # an input's update left as a copy_ runs after the outputs are taken, as AOTAutograd's did;
    # one whose result is returned runs in its place, before the outputs' layouts are fixed
    returned = output_memory(schedule)
    updates = [u.step for u in input_updates(schedule) if u.step not in returned]
    for step in schedule.steps:
        if any(step is u for u in updates):
            continue
        if isinstance(step, KernelPlan):
            kern = kernels[id(step)]
            for root in (r for r in step.roots if by_name[buffer_names[r]] is r):
                b.body.append(Alloc(buffer_names[root], root.shape, layouts(root), root.dtype))
            if kern.outer_numel != 0:  # an empty output needs no kernel
                if kern.name not in launched:
                    launched[kern.name] = kernel_digest(kern)
                args = tuple(a for a in kern.args if a != ERROR_PARAM)
                writes = tuple(a for a, p in zip(kern.args, kern.params)
                               if p.is_output and a != ERROR_PARAM)
                start = error_offsets.get(id(step))
                errors = (start, start + SLOTS_PER_CHECK * len(kern.checks)) if kern.checks else None
                aligned = not any(_may_be_unaligned(by_name[a]) for a in args)
                b.body.append(Launch(kern.name, args, writes, errors, aligned, size_params(kern).sizes))
        elif step.op is Op.EXTERN:
            _extern(b, step, step in layout_checked)
        elif step.op is Op.ITEM:
            name = buffer_names[step]
            b.body.append(Item(name, buffer_names[step.inputs[0]], step.attrs[0]))
            if step in layout_checked:
                b.body.append(EnsureLayout(name, name, step.shape, layouts(step), step.dtype))
    values = _outputs(b)
    for step in updates:
        _extern(b, step, False)
    if checks:
        b.body.append(CheckErrors())
    b.body.append(Return(tuple(values)))
    inputs = tuple(InputSpec(buffer_names[n], n.attrs[0], n.dtype, n.shape, tuple(n.attrs[1]), str(device))
                   for n in graph.nodes if n.op is Op.INPUT and n in buffer_names)
    return HostProgram(str(device), "pointers" if pass_pointers else "tensors", graph.num_inputs, inputs,
                       tuple(b.body), tuple(launched.items()), (), tuple(checks), b.constants,
                       _size_bindings(graph, b.body))


def _size_bindings(graph, body) -> tuple[SizeBinding, ...]:
    """Where each size symbol the program computes with is read at a call: an int argument
    that is the symbol, else a tensor input's size that is it."""
    used = symbols(*[getattr(ins, f.name) for ins in body for f in dataclasses.fields(ins)])
    used |= symbols(*[(n.shape, n.attrs[1]) for n in graph.nodes if n.op is Op.INPUT])
    if not used:
        return ()
    found: dict = {}
    for position, size in getattr(graph, "size_inputs", ()):
        if size in used:
            found.setdefault(size, SizeBinding(str(size), position))
    for n in graph.nodes:
        if n.op is Op.INPUT:
            for dim, size in enumerate(n.shape):
                if size in used:
                    found.setdefault(size, SizeBinding(str(size), n.attrs[0], dim))
    missing = used - set(found)
    if missing:
        raise NeedsNumber(f"the sizes {sorted(map(str, missing))} are no argument's and no input's size")
    return tuple(found[s] for s in sorted(found, key=str))


def _extern(b: _Builder, step: Node, layout_checked: bool) -> None:
    argnames = []
    for i in step.inputs:
        alias = b.schedule.aliases.get(i)
        if alias is not None:
            argnames.append(b.view(f"view{i.id}", alias, b.names))
        else:
            argnames.append(b.names[i])
    target, args_t, kwargs_t = step.attrs[0], step.attrs[1], step.attrs[2]
    if isinstance(target, UserKernelCall) and target.reason is None:
        tensors = {p: Ref(argnames[a.index]) for p, a in zip(target.tensor_params, args_t)}
        args = tuple((p, v if isinstance(v, Ref) else b.literal(v, argnames))
                     for p, v in target.arguments(tensors))
        b.body.append(LaunchUser(b.names[step], target.name, target.digest, tuple(target.grid), args,
                                 target.clones, target.returns))
        return
    if hasattr(target, "as_aten"):  # a call kiln made up, written as the ATen call it is
        target, args_t = target.as_aten(*args_t)
    op = op_name(target) or b.constant(target, "fn")
    name = b.names[step]
    args = tuple(b.literal(a, argnames) for a in args_t)
    kwargs = tuple((k, b.literal(v, argnames)) for k, v in kwargs_t.items())
    b.body.append(CallAten(name, op, args, kwargs, schema_may_alias(target)))
    if step.attrs[5] and layout_checked:
        b.body.append(EnsureLayout(name, name, step.shape, b.layouts(step), step.dtype))


def _outputs(b: _Builder) -> list[Any]:
    """Instructions that give each output eager's layout and memory; the returned values."""
    schedule, graph = b.schedule, b.schedule.graph
    values: list[Any] = []
    returned: set[Node] = set()
    fresh = graph.output_fresh or [False] * len(graph.outputs)
    eager_strides = graph.output_strides or [None] * len(graph.outputs)
    storage = graph.output_storage or [None] * len(graph.outputs)
    copies: dict[tuple[int, Node], str] = {}
    for position, o in enumerate(graph.outputs):
        if not isinstance(o, Node):
            values.append(canonical(o) if is_literal(o) else b.constant(o))
            continue
        want = eager_strides[position]
        out = f"out{position}"
        owner = _input_memory(o, schedule)
        if owner is not None and storage[position] is not None:
            # eager's output is in memory the graph allocated; kiln's is in an input's (a cat
            # with an empty part, a clone): return it from one copy per memory eager has, so
            # that a later update of the input does not show and views of it stay views
            key = (storage[position], owner)
            if key not in copies:
                copies[key] = f"copy{len(copies)}"
                b.body.append(CopyMemory(copies[key], b.names[owner]))
            names = {**b.names, owner: copies[key]}
            values.append(Ref(_in_eager_layout(b, o, want, names, out)))
        elif fresh[position] and _shares_memory(o, schedule, returned):
            # eager returns new memory here; the value kiln has is an input, a view or
            # another output, so copy it (in eager's layout)
            stride = want if want is not None and is_non_overlapping(o.shape, want) else b.layouts(o)
            alias = schedule.aliases.get(o)
            source = b.view(out + "v", alias, b.names) if alias else b.names[o]
            b.body.append(Restride(out, source, tuple(stride)))
            values.append(Ref(out))
        else:
            values.append(Ref(_in_eager_layout(b, o, want, b.names, out)))
        returned.add(o)
    return values


def _in_eager_layout(b: _Builder, o: Node, want: tuple | None, names: dict[Node, str], out: str) -> str:
    """The name of o with eager's strides exactly: AOTAutograd regenerates views from them,
    and a backward compiled for them reads the tensors saved for it. An ATen result (not a
    view of an input's copy) is fixed where it is, so that returning it twice returns one
    tensor."""
    alias = b.schedule.aliases.get(o)
    src = names[o] if not alias else None
    if want is None or len(want) != len(o.shape):
        return b.view(out, alias, names) if alias else src
    want = tuple(want)
    if o.op in (Op.EXTERN, Op.ITEM) and not alias:
        if not is_non_overlapping(o.shape, want):
            return src
        target = src if src == b.names[o] else out
        b.body.append(EagerLayout(target, src, o.shape, want))
        return target
    have = alias.stride if alias else b.layouts(o)
    if have == want:
        return b.view(out, alias, names) if alias else src
    if same_strides(o.shape, have, want):  # differs only where no element is addressed
        if alias:
            offset = alias.offset if math.prod(alias.shape) else 0
            b.body.append(View(out, names[alias.base], o.shape, want, offset))
        else:
            b.body.append(View(out, src, o.shape, want, 0))
        return out
    if not is_non_overlapping(o.shape, want):
        return b.view(out, alias, names) if alias else src
    source = b.view(out + "v", alias, names) if alias else src
    b.body.append(Restride(out, source, want))
    return out


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

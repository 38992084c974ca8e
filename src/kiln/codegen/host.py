"""Python from the host program (ir/host.py): `call(args)`, with the boxed calling convention
(the caller's list is cleared, so that the program holds the only references to its inputs
and frees each after its last read).

Everything a call needs that does not change between calls (resolved ATen overloads,
constant arguments, launchers, the checks) is bound once, as a global of the generated
code; the globals hold only what the program names.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from kiln.ir.checks import INDEX_RULES, SLOTS_PER_CHECK
from kiln.ir.host import (
    Alloc,
    CallAten,
    CheckErrors,
    ConstRef,
    CopyMemory,
    EagerLayout,
    EnsureLayout,
    Free,
    HostProgram,
    Item,
    Launch,
    LaunchUser,
    Ref,
    Restride,
    Return,
    View,
    reads,
    refs,
    resolve_op,
    size_str,
)
from kiln.ir.sizes import is_symbolic, symbols
from kiln.passes.layout import same_strides
from kiln.runtime import host_ops, profiling, user_kernels


class _Emitter:
    """Source lines of call() and the globals they name."""

    def __init__(self, program: HostProgram):
        self.program = program
        self.lines: list[str] = []
        self.indent = "    "
        self.globals: dict[str, Any] = {"torch": torch, "device": torch.device(program.device)}
        self.slot_address = _slot_addresses(program)
        self.arena_views = _arena_views(program, self.slot_address)

    def bind(self, prefix: str, value: Any) -> str:
        """A global holding value (one per distinct object)."""
        for name, held in self.globals.items():
            if held is value and name.startswith(prefix):
                return name
        name = f"{prefix}{sum(1 for n in self.globals if n.startswith(prefix))}"
        self.globals[name] = value
        return name

    def helper(self, name: str, value: Any) -> str:
        self.globals[name] = value
        return name

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)


def _shape(sizes) -> str:
    """A tuple of sizes as Python source."""
    text = ", ".join(size_str(s) for s in sizes)
    return f"({text},)" if len(sizes) == 1 else f"({text})"


def _literal(e: _Emitter, v: Any) -> str:
    """Source for an ATen call's argument: buffers by name; anything without a buffer in it
    that Python cannot write as a plain literal is a global, built once."""
    if isinstance(v, Ref):
        return v.name
    if isinstance(v, ConstRef):
        return e.helper(v.name, e.program.constants[v.name])
    if is_symbolic(v):  # a size of the shape family, computed from this call's sizes
        return size_str(v)
    if isinstance(v, (list, tuple)) and (refs(v) or symbols(v)):
        inner = ", ".join(_literal(e, x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner},)"
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v)
    if isinstance(v, float) and v == v and v not in (float("inf"), float("-inf")):
        return repr(v)
    return e.bind("lit", _value(e, v))


def _value(e: _Emitter, v: Any) -> Any:
    """A literal without buffers in it as the object it stands for (constants resolved)."""
    if isinstance(v, ConstRef):
        return e.program.constants[v.name]
    if isinstance(v, list):
        return [_value(e, x) for x in v]
    if isinstance(v, tuple):
        return tuple(_value(e, x) for x in v)
    return v


def _slot_addresses(program: HostProgram) -> dict[str, int]:
    """Arena buffers that only kernels taking addresses read or write, by slot: they need no
    tensor, only the slot's address (the same for every call of a thread)."""
    if program.launch_abi != "pointers":
        return {}
    in_slots = {i.out: i.slot for i in program.body if isinstance(i, Alloc) and i.slot is not None}
    used_otherwise = {name for i in program.body if not isinstance(i, Launch) for name in reads(i)}
    return {name: slot for name, slot in in_slots.items() if name not in used_otherwise}


def _arena_views(program: HostProgram, slot_address: dict[str, int]) -> list[tuple]:
    """The (slot, shape, stride) of each distinct arena buffer of fixed sizes that needs a
    tensor: made once per thread with its arena, as the slot and its memory are, instead of
    a view per buffer per call."""
    views: list[tuple] = []
    for i in program.body:
        if isinstance(i, Alloc) and i.slot is not None and i.out not in slot_address:
            view = (i.slot, tuple(i.shape), tuple(i.stride))
            if view not in views and not symbols(view):
                views.append(view)
    return views


def _alloc(e: _Emitter, i: Alloc) -> None:
    if i.out in e.slot_address:
        return
    view = (i.slot, tuple(i.shape), tuple(i.stride))
    if view in e.arena_views:
        e.emit(f"{i.out} = arena_view[{e.arena_views.index(view)}]")
    elif i.slot is not None:
        e.helper("view", host_ops.view)
        e.emit(f"{i.out} = view(arena[{i.slot}], {_shape(i.shape)}, {_shape(i.stride)}, 0)")
    else:
        e.helper("empty_strided", torch.empty_strided)
        e.emit(f"{i.out} = empty_strided({_shape(i.shape)}, {_shape(i.stride)}, dtype={i.dtype}, "
               "device=device)")


def _view(e: _Emitter, i: View) -> None:
    e.helper("view", host_ops.view)  # its offset is counted from base's own
    e.emit(f"{i.out} = view({i.base}, {_shape(i.shape)}, {_shape(i.stride)}, {size_str(i.offset)})")


def _launch(e: _Emitter, i: Launch, launchers: Mapping[str, Callable] | None) -> None:
    e.globals[i.kernel] = launchers[i.kernel] if launchers is not None else None
    if e.program.launch_abi == "pointers":
        args = [f"arena_address[{e.slot_address[a]}]" if a in e.slot_address else f"{a}.data_ptr()"
                for a in i.args]
        if i.errors:
            args.append(f"errors.data_ptr() + {i.errors[0] * 8}")
        args += [size_str(s) for s in i.sizes]
        e.emit(f"{i.kernel}({', '.join(args)})")
        return
    args = list(i.args) + ([f"errors[{i.errors[0]}:{i.errors[1]}]"] if i.errors else [])
    args += [size_str(s) for s in i.sizes]
    entry = f"{i.kernel}.aligned" if i.aligned else i.kernel
    e.emit(f"{entry}({', '.join(args)})")


def _launch_user(e: _Emitter, i: LaunchUser) -> None:
    """Copies of the parameters in clones, the launch, then the returned tensors as a tuple."""
    launch = e.bind("user_kernel", user_kernels.launcher(i.kernel, i.digest, e.program.device))
    values = {p: _literal(e, v) for p, v in i.args}
    for p in i.clones:
        if i.buffer(p) is not None:
            copy = f"{i.out}_{p}"
            e.emit(f"{copy} = {e.helper('copy_memory', host_ops.copy_memory)}({values[p]})")
            values[p] = copy
    arguments = ", ".join(f"{p}={v}" for p, v in values.items())
    e.emit(f"{launch}({_shape(i.grid)}, {arguments})")
    e.emit(f"{i.out} = ({''.join(values[p] + ', ' for p in i.returns)})")


def _call_aten(e: _Emitter, i: CallAten) -> None:
    if isinstance(i.op, ConstRef):
        fn = e.helper(i.op.name, e.program.constants[i.op.name])
    else:
        try:
            target = resolve_op(i.op)
        except (AttributeError, ImportError, RuntimeError, ValueError) as error:
            message = f"kiln: the host program calls {i.op}, which this PyTorch does not have"
            raise ValueError(message) from error
        fn = e.bind("op_", host_ops.fast_binding(target))
    parts = [_literal(e, a) for a in i.args] + [f"{k}={_literal(e, v)}" for k, v in i.kwargs]
    e.emit(f"{i.out} = {fn}({', '.join(parts)})")


def _ensure_layout(e: _Emitter, i: EnsureLayout) -> None:
    e.helper("restride", host_ops.restride)
    stride = _shape(i.stride)
    test = f"{i.src}.stride() != {stride} or {i.src}.dtype != {i.dtype}"
    if i.out == i.src:
        e.emit(f"if {test}: {i.out} = restride({i.src}, {stride}, {i.dtype})")
    else:
        e.emit(f"{i.out} = restride({i.src}, {stride}, {i.dtype}) if {test} else {i.src}")


def _eager_layout(e: _Emitter, i: EagerLayout) -> None:
    for name, fn in (("as_strided", torch.as_strided), ("same_strides", same_strides),
                     ("restride", host_ops.restride)):
        e.helper(name, fn)
    shape, stride, s = _shape(i.shape), _shape(i.stride), i.src
    fixed = (f"as_strided({s}, {shape}, {stride}, {s}.storage_offset()) "
             f"if same_strides({shape}, {s}.stride(), {stride}) else restride({s}, {stride})")
    if i.out == s:
        e.emit(f"if {s}.stride() != {stride}: {s} = {fixed}")
    else:
        e.emit(f"{i.out} = {s} if {s}.stride() == {stride} else {fixed}")


def _check_errors(e: _Emitter, i: CheckErrors) -> None:
    checks = e.program.checks
    if torch.device(e.program.device).type == "cuda":
        # eager's CUDA kernels assert on the device, asynchronously: reading the errors on
        # the host would wait for every kernel at every call (and cannot be captured).
        # They check indices only: an integer division by zero does not stop them.
        rows = [r for r, c in enumerate(checks) if c.rule in INDEX_RULES]
        if rows:
            e.helper("assert_async", torch._assert_async)
            e.helper("checks_message", host_ops.checks_message(checks))
            e.emit(f"assert_async(errors[{_index_flags(e, rows)}].eq(0).all(), checks_message)")
    else:  # one read of the errors per call, after all launches
        e.helper("raise_reported", host_ops.raise_reported)
        e.emit("if errors.any():")
        e.emit(f"    raise_reported(errors, checks, {_shape([c.size for c in checks])})")


def _index_flags(e: _Emitter, rows: list[int]) -> str:
    """The index of the flags of the checks in rows among the error slots: a strided slice
    where the rows run in a sequence (no tensor), else a tensor of their positions. That tensor
    is made outside any fake or functional mode of the compile, since the program runs on the
    real error slots."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return f"{SLOTS_PER_CHECK * rows[0]}:{SLOTS_PER_CHECK * (rows[-1] + 1)}:{SLOTS_PER_CHECK}"
    with torch.utils._python_dispatch._disable_current_modes():
        flags = torch.tensor([SLOTS_PER_CHECK * r for r in rows], device=torch.device(e.program.device))
    return e.helper("index_flags", flags)


def _return(e: _Emitter, i: Return) -> None:
    e.emit(f"return [{', '.join(_literal(e, v) for v in i.values)}]")


_RENDER = {
    Alloc: _alloc,
    View: _view,
    CallAten: _call_aten,
    LaunchUser: _launch_user,
    Item: lambda e, i: e.emit(f"{i.out} = {i.src}[{i.index}]"),
    EnsureLayout: _ensure_layout,
    EagerLayout: _eager_layout,
    Restride: lambda e, i: e.emit(f"{i.out} = {e.helper('restride', host_ops.restride)}({i.src}, "
                                  f"{_shape(i.stride)})"),
    CopyMemory: lambda e, i: e.emit(f"{i.out} = {e.helper('copy_memory', host_ops.copy_memory)}({i.src})"),
    Free: lambda e, i: e.emit(f"del {i.name}"),
    CheckErrors: _check_errors,
    Return: _return,
}


def generate(program: HostProgram, launchers: Mapping[str, Callable] | None = None,
             check_inputs: bool = False, profiled: Callable | None = None) -> tuple[str, dict[str, Any]]:
    """The source of call(args) and its globals. Launchers by kernel name (None: left unbound,
    for showing the source). check_inputs: check each input against the program's InputSpecs
    first (for a program run without guards of its own, as Dynamo's are). profiled: the call
    to run instead while torch's profiler runs (runtime/profiling.py)."""
    e = _Emitter(program)
    if profiled is not None:
        e.helper("autograd_profiler", profiling.autograd_profiler)
        e.helper("profiled_call", profiled)
        e.emit("if autograd_profiler._is_profiler_enabled: return profiled_call(args)")
    names = [f"arg{k}" for k in range(program.num_args)]
    if check_inputs:
        e.helper("check_arg_count", host_ops.check_arg_count)
        e.emit(f"check_arg_count(args, {program.num_args})")
    if names:
        e.emit(f"{', '.join(names)}, = args")
    e.emit("args.clear()")
    for b in program.sizes:  # the shape family's sizes of this call
        e.emit(f"{b.symbol} = arg{b.position}" + (f".size({b.dim})" if b.dim is not None else ""))
    if check_inputs:
        e.helper("check_input", host_ops.check_input)
        for spec in program.inputs:
            e.emit(f"check_input({spec.name}, {e.bind('input_spec', spec)})")
    if program.arena:
        arena = host_ops.thread_arena(program.arena, torch.device(program.device), e.arena_views)
        e.helper("arena_for_thread", arena)
        e.emit("arena, arena_address, arena_view, arena_release = arena_for_thread()")
        e.emit("try:")  # the arena is handed back however the program ends
        e.indent += "    "
    if program.checks:
        e.helper("zeros", torch.zeros)
        e.helper("checks", program.checks)
        e.emit(f"errors = zeros({SLOTS_PER_CHECK * len(program.checks)}, dtype=torch.int64, device=device)")
    for ins in program.body:
        if isinstance(ins, Launch):
            _launch(e, ins, launchers)
        else:
            _RENDER[type(ins)](e, ins)
    if program.arena:
        e.indent = "    "
        e.emit("finally:")
        e.emit("    arena_release()")
    return "def call(args):\n" + "\n".join(e.lines) + "\n", e.globals


def load(program: HostProgram, launchers: Mapping[str, Callable],
         check_inputs: bool = False) -> Callable[[list], list]:
    """The program as a Python function of a list of arguments (which it clears)."""
    return load_with_source(program, launchers, check_inputs)[0]


def load_with_source(program: HostProgram, launchers: Mapping[str, Callable],
                     check_inputs: bool = False) -> tuple[Callable[[list], list], str]:
    missing = sorted({ins.kernel for ins in program.body if isinstance(ins, Launch)} - set(launchers))
    if missing:
        raise ValueError(f"kiln: no launcher for kernels {missing} of the host program")
    def with_ranges() -> Callable[[list], list]:
        source, scope = generate(program, profiling.ranged(launchers), check_inputs)
        exec(compile(source, "<kiln host program, profiled>", "exec"), scope)
        return scope["call"]

    source, scope = generate(program, launchers, check_inputs, profiling.LazyProfiled(with_ranges))
    exec(compile(source, "<kiln host program>", "exec"), scope)
    return scope["call"], source

"""The host program as data: what runs on the host around the kernels of one graph.

A program takes its inputs (checked against what the compiled code relies on), allocates
buffers, launches kernels by name, calls ATen ops by qualified name with literal arguments,
frees what is dead and returns the outputs in eager's layouts. It prints as stable text (for
golden tests and cache keys) and converts to and from JSON-compatible dicts without pickling
live objects: ATen ops are resolved again by name, kernels by name, tensor constants travel
as plain tensors in a separate blob. codegen/host.py generates the Python that runs it;
passes/memory.py plans its memory.

Buffers are named ("arg0", "buf3", "out0"); an instruction refers to buffers by name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from kiln.ir.checks import Check
from kiln.ir.sizes import Size, is_symbolic, parse
from kiln.ir.sizes import render as render_size
from kiln.ir.sizes import text as size_text
from kiln.ir.tensor import dtype_name

# A size, stride or offset: an int, or with a shape family an expression over its size
# symbols (ir/sizes.py), which the program reads from its arguments at each call (SizeBinding).
# Only size_str renders one (as Python) and only encode/decode serialize one (as text).
FORMAT_VERSION = 2


def size_str(s: Size) -> str:
    return render_size(s, lang="python")


def sizes_str(sizes: tuple[Size, ...]) -> str:
    return "[" + ", ".join(size_str(s) for s in sizes) + "]"


def extent(shape: tuple[Size, ...], stride: tuple[Size, ...]) -> Size:
    """Elements a layout spans from its first element (0 for an empty tensor)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


@dataclass(frozen=True)
class Ref:
    """A buffer of the program, as an argument of an ATen call or a returned value."""

    name: str


@dataclass(frozen=True)
class ConstRef:
    """A named constant of the program (HostProgram.constants)."""

    name: str


@dataclass(frozen=True)
class InputSpec:
    """What the compiled code relies on for one tensor input."""

    name: str
    position: int
    dtype: torch.dtype
    shape: tuple[Size, ...]
    stride: tuple[Size, ...]
    device: str


@dataclass(frozen=True)
class SizeBinding:
    """A size symbol of the shape family, read at each call: args[position] itself (an int
    argument) or, with dim, its size along dim."""

    symbol: str
    position: int
    dim: int | None = None


@dataclass(frozen=True)
class Slot:
    """A piece of the per-thread arena: room for `extent` elements of dtype, `offset` bytes
    into the arena (a multiple of SLOT_ALIGN). Slots whose temporaries are never alive at
    once may overlap (passes/memory.py)."""

    dtype: torch.dtype
    extent: Size
    offset: int


SLOT_ALIGN = 64  # bytes: a cache line, and the widest vector a kernel loads


def slot_bytes(dtype: torch.dtype, extent: Size) -> int:
    """The room a slot takes: its elements' bytes (at least one element's) rounded up to
    SLOT_ALIGN, so the next slot starts aligned."""
    return -(-max(int(extent), 1) * dtype.itemsize // SLOT_ALIGN) * SLOT_ALIGN


def arena_bytes(slots: tuple[Slot, ...]) -> int:
    """The bytes an arena holding the slots needs."""
    return max((s.offset + slot_bytes(s.dtype, s.extent) for s in slots), default=0)


@dataclass(frozen=True)
class Alloc:
    """New memory for out; with a slot, a view of that slot of the arena instead."""

    out: str
    shape: tuple[Size, ...]
    stride: tuple[Size, ...]
    dtype: torch.dtype
    slot: int | None = None


@dataclass(frozen=True)
class View:
    """out = base viewed with shape and strides, `offset` elements past base's own offset."""

    out: str
    base: str
    shape: tuple[Size, ...]
    stride: tuple[Size, ...]
    offset: Size = 0


@dataclass(frozen=True)
class Launch:
    """Run a kernel on its buffers (reads and writes, in parameter order); `errors` is its
    range of the error buffer, in int64 slots. `aligned`: every buffer is known to start on
    a 16-byte boundary (launchers taking tensors then skip their check)."""

    kernel: str
    args: tuple[str, ...]
    writes: tuple[str, ...]
    errors: tuple[int, int] | None = None
    aligned: bool = False
    sizes: tuple[Size, ...] = ()  # the kernel's size parameters (Kernel.sizes), after the buffers


@dataclass(frozen=True)
class LaunchUser:
    """out = the tensors of parameters `returns` after a user's @triton.jit kernel ran on
    `grid` with `args` ((parameter, Ref or literal), in the call's order). kernel: its
    "module:qualname", digest: of its source (a program re-finds it by both). Each parameter
    in `clones` gets a copy of its buffer first, so the caller's tensor keeps its values (the
    functional form's rule); the memory plan drops the copy of a buffer dead after the launch."""

    out: str
    kernel: str
    digest: str
    grid: tuple[Size, ...]
    args: tuple[tuple[str, Any], ...]
    clones: tuple[str, ...]
    returns: tuple[str, ...]

    def buffer(self, param: str) -> str | None:
        value = dict(self.args).get(param)
        return value.name if isinstance(value, Ref) else None


@dataclass(frozen=True)
class CallAten:
    """out = op(*args, **kwargs). op: a qualified overload name ("aten::add.Tensor"), or a
    ConstRef to a callable no name resolves. Arguments are literals, Refs and ConstRefs.
    may_alias: the result may share memory with the arguments (per the op's schema)."""

    out: str
    op: str | ConstRef
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()
    may_alias: bool = True


@dataclass(frozen=True)
class Item:
    """out = src[index]: one result of a multi-output ATen call."""

    out: str
    src: str
    index: int


@dataclass(frozen=True)
class EnsureLayout:
    """out = src if it has these strides and dtype, else a copy in them (in new memory): the
    layout kernels and views were compiled for, which an ATen op does not always return."""

    out: str
    src: str
    shape: tuple[Size, ...]
    stride: tuple[Size, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class EagerLayout:
    """out = src with eager's strides: relabeled where they address the same elements,
    else copied into them. For an ATen result, whose strides are known at run time only."""

    out: str
    src: str
    shape: tuple[Size, ...]
    stride: tuple[Size, ...]


@dataclass(frozen=True)
class Restride:
    """out = a copy of src in new memory with these strides."""

    out: str
    src: str
    stride: tuple[Size, ...]


@dataclass(frozen=True)
class CopyMemory:
    """out = a copy of the memory src spans, in src's layout: views of src rebuilt on out
    with src's strides and offsets address the same values."""

    out: str
    src: str


@dataclass(frozen=True)
class Free:
    name: str


@dataclass(frozen=True)
class CheckErrors:
    """Raise what the kernels' checks reported (ir/checks.py), as eager would have."""


@dataclass(frozen=True)
class Return:
    values: tuple[Any, ...]  # Refs, ConstRefs and literals


Instr = Union[Alloc, View, Launch, LaunchUser, CallAten, Item, EnsureLayout, EagerLayout, Restride,
              CopyMemory, Free, CheckErrors, Return]


@dataclass(frozen=True)
class HostProgram:
    device: str
    launch_abi: str  # "pointers": launchers take addresses (C++); "tensors": they take tensors (Triton)
    num_args: int  # arguments of the boxed call, tensors or not
    inputs: tuple[InputSpec, ...]
    body: tuple[Instr, ...]
    kernels: tuple[tuple[str, str], ...] = ()  # (name, content hash) of each launched kernel
    arena: tuple[Slot, ...] = ()
    checks: tuple[Check, ...] = ()
    # tensors (stored by value) and objects no name resolves; compared by name, not value
    constants: dict[str, Any] = field(default_factory=dict, compare=False)
    sizes: tuple[SizeBinding, ...] = ()  # the shape family's symbols, read from the arguments

    def __str__(self) -> str:
        return program_str(self)

    def to_dict(self) -> dict:
        return to_dict(self)

    @staticmethod
    def from_dict(data: dict, constants: bytes | None = None) -> HostProgram:
        return from_dict(data, constants)


# --- what each instruction reads and defines (for passes over the program) ---


def refs(value: Any) -> list[str]:
    """The buffers a literal argument refers to."""
    if isinstance(value, Ref):
        return [value.name]
    if isinstance(value, (list, tuple)):
        return [name for v in value for name in refs(v)]
    return []


def reads(ins: Instr) -> tuple[str, ...]:
    """The buffers an instruction reads (a kernel's outputs are written, not read)."""
    if isinstance(ins, Launch):
        return tuple(a for a in ins.args if a not in ins.writes)
    if isinstance(ins, CallAten):
        return tuple(refs(ins.args) + refs([v for _, v in ins.kwargs]))
    if isinstance(ins, LaunchUser):
        return tuple(refs([v for _, v in ins.args]))
    if isinstance(ins, View):
        return (ins.base,)
    if isinstance(ins, (Item, EnsureLayout, EagerLayout, Restride, CopyMemory)):
        return (ins.src,)
    if isinstance(ins, Return):
        return tuple(refs(ins.values))
    return ()


def may_share_memory(ins: Instr) -> tuple[str, ...]:
    """The buffers whose memory an instruction's result may be (a view, a relabel)."""
    if isinstance(ins, View):
        return (ins.base,)
    if isinstance(ins, (Item, EnsureLayout, EagerLayout)):
        return (ins.src,)
    if isinstance(ins, CallAten) and ins.may_alias:
        return reads(ins)
    if isinstance(ins, LaunchUser):  # a returned parameter not copied is its buffer itself
        return tuple(b for p in ins.returns if p not in ins.clones and (b := ins.buffer(p)) is not None)
    return ()


# --- text ---


def _value_str(v: Any) -> str:
    if isinstance(v, Ref):
        return v.name
    if isinstance(v, ConstRef):
        return v.name
    if isinstance(v, list):
        return "[" + ", ".join(_value_str(x) for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(_value_str(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    return repr(v) if isinstance(v, str) else str(v)


def _layout_str(dtype, shape, stride) -> str:
    return f"{dtype_name(dtype)}{sizes_str(shape)} stride {sizes_str(stride)}"


def _errors_str(ins: Launch) -> str:
    return f" errors[{ins.errors[0]}:{ins.errors[1]}]" if ins.errors else ""


_INSTR_TEXT = {
    Alloc: lambda i: f"{i.out} = alloc {_layout_str(i.dtype, i.shape, i.stride)}"
    + (f" in slot {i.slot}" if i.slot is not None else ""),
    View: lambda i: f"{i.out} = view {i.base} {sizes_str(i.shape)} stride {sizes_str(i.stride)} "
    f"offset {size_str(i.offset)}",
    Launch: lambda i: f"launch {i.kernel}({', '.join(i.args)}) writes {', '.join(i.writes)}"
    + _errors_str(i) + (" aligned" if i.aligned else "")
    + (f" sizes {sizes_str(i.sizes)}" if i.sizes else ""),
    LaunchUser: lambda i: f"{i.out} = launch_user {i.kernel} {i.digest} grid {sizes_str(i.grid)}("
    + ", ".join(f"{p}={_value_str(v)}" for p, v in i.args) + ")"
    + (f" copies {', '.join(i.clones)}" if i.clones else "") + f" returns ({', '.join(i.returns)})",
    CallAten: lambda i: f"{i.out} = call {i.op if isinstance(i.op, str) else i.op.name}("
    + ", ".join([_value_str(a) for a in i.args] + [f"{k}={_value_str(v)}" for k, v in i.kwargs]) + ")"
    + ("" if i.may_alias else " fresh"),
    Item: lambda i: f"{i.out} = item {i.src}[{i.index}]",
    EnsureLayout: lambda i: f"{i.out} = ensure_layout {i.src} {_layout_str(i.dtype, i.shape, i.stride)}",
    EagerLayout: lambda i: f"{i.out} = eager_layout {i.src} {sizes_str(i.shape)} "
    f"stride {sizes_str(i.stride)}",
    Restride: lambda i: f"{i.out} = restride {i.src} stride {sizes_str(i.stride)}",
    CopyMemory: lambda i: f"{i.out} = copy_memory {i.src}",
    Free: lambda i: f"free {i.name}",
    CheckErrors: lambda i: "check_errors",
    Return: lambda i: "return " + _value_str(tuple(i.values)),
}


def instr_str(ins: Instr) -> str:
    return _INSTR_TEXT[type(ins)](ins)


def tensor_digest(t: torch.Tensor) -> str:
    """A digest of a tensor's values: the text of two programs differs where a constant does."""
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def _constant_str(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        layout = _layout_str(value.dtype, tuple(value.shape), tuple(value.stride()))
        return f"tensor {layout} {tensor_digest(value)}"
    return f"object {type(value).__name__}"


def program_str(p: HostProgram) -> str:
    lines = [f"host program on {p.device}, launchers take {p.launch_abi}, {p.num_args} args"]
    lines.extend(f"size {b.symbol} = args[{b.position}]" + (f".size({b.dim})" if b.dim is not None else "")
                 for b in p.sizes)
    for s in p.inputs:
        lines.append(f"input {s.name} = args[{s.position}] : {_layout_str(s.dtype, s.shape, s.stride)} "
                     f"on {s.device}")
    lines.extend(f"kernel {name} {digest}" for name, digest in p.kernels)
    lines.extend(f"const {name} : {_constant_str(v)}" for name, v in sorted(p.constants.items()))
    lines.extend(f"slot {k} : {dtype_name(s.dtype)}[{size_str(s.extent)}] at byte {s.offset}"
                 for k, s in enumerate(p.arena))
    lines.extend(f"check {k} : {c}" for k, c in enumerate(p.checks))
    lines.extend("  " + instr_str(ins) for ins in p.body)
    return "\n".join(lines)


# --- ATen ops by qualified name ---


def op_name(target: Any) -> str | None:
    """The name resolve_op finds target by: "ns::name.overload" for an ATen operator,
    "ns::name" for a higher-order operator, "py:module:qualname" for a Python function;
    None when no name leads back to it (a lambda, a bound method)."""
    if isinstance(target, torch._ops.OpOverload):
        name = target.name()
        name = name if "." in name.split("::")[-1] else name + ".default"
    elif isinstance(target, torch._ops.HigherOrderOperator):
        name = f"{target.namespace}::{target.name()}"
    elif callable(target) and hasattr(target, "__module__") and hasattr(target, "__qualname__"):
        name = f"py:{target.__module__}:{target.__qualname__}"
    else:
        return None
    try:
        return name if resolve_op(name) is target else None
    except (AttributeError, ImportError, RuntimeError, ValueError):
        return None


def resolve_op(name: str) -> Any:
    """The operator or function a name from op_name stands for."""
    if name.startswith("py:"):
        _, module, qualname = name.split(":", 2)
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    namespace, rest = name.split("::", 1)
    packet_name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), packet_name)
    return getattr(packet, overload) if overload else packet


# --- users' Triton kernels by name ---


def kernel_identity(kernel: Any) -> tuple[str, str]:
    """("module:qualname", digest of its source): how a program names a JIT function. The
    source is Triton's own key of it where it has one (the JIT functions it calls and the
    globals it reads included), else its text."""
    fn = kernel.fn
    try:
        source = str(kernel.cache_key)
    except Exception:  # noqa: BLE001 - a kernel Triton cannot key is named by its text
        source = getattr(kernel, "src", "") or ""
    return f"{fn.__module__}:{fn.__qualname__}", hashlib.sha256(source.encode()).hexdigest()[:16]


def find_user_kernel(name: str, digest: str) -> Any:
    """The JIT function a name from kernel_identity leads to in this process, with the same
    source; LookupError with the reason otherwise."""
    module, _, qualname = name.partition(":")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise LookupError(f"the Triton kernel {name} is defined inside a function: no import re-finds it")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as error:
        raise LookupError(f"the Triton kernel {name} cannot be imported ({error})") from error
    if not hasattr(obj, "fn") or kernel_identity(obj) != (name, digest):
        raise LookupError(f"the Triton kernel {name} has another source than the one compiled")
    return obj


# --- JSON-compatible form ---

def _torch_name(value: Any) -> str:
    return str(value).removeprefix("torch.")


def _torch_attr(name: str) -> Any:
    return getattr(torch, name)


# One NaN object for every NaN literal: NaN != NaN, but containers compare items by identity
# first, so programs with NaN literals stay equal after a round trip.
NAN = float("nan")


def canonical(value: Any) -> Any:
    return NAN if isinstance(value, float) and value != value else value


_TAGGED_TYPES = {  # type -> (tag, encode, decode)
    float: ("float", repr, lambda text: canonical(float(text))),
    torch.dtype: ("dtype", _torch_name, _torch_attr),
    torch.device: ("device", str, torch.device),
    torch.layout: ("layout", _torch_name, _torch_attr),
    torch.memory_format: ("memory_format", _torch_name, _torch_attr),
    complex: ("complex", lambda c: [repr(c.real), repr(c.imag)], lambda p: complex(float(p[0]), float(p[1]))),
    Ref: ("ref", lambda r: r.name, Ref),
    ConstRef: ("const", lambda r: r.name, ConstRef),
    list: ("list", lambda v: [encode(x) for x in v], lambda v: [decode(x) for x in v]),
}
_DECODERS = {tag: dec for tag, _, dec in _TAGGED_TYPES.values()}


def encode(value: Any) -> Any:
    """A JSON-compatible form of a field or literal: tuples become lists, and every other
    non-JSON type a one-key dict naming it."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if is_symbolic(value):
        return {"size": size_text(value)}
    if isinstance(value, tuple):
        return [encode(v) for v in value]
    if isinstance(value, Check):
        return {"check": [value.rule, value.dim, encode(value.size), value.input]}
    entry = _TAGGED_TYPES.get(type(value))
    if entry is None:
        raise ValueError(f"kiln: a host program value of type {type(value).__name__} cannot be serialized")
    tag, enc, _ = entry
    return {tag: enc(value)}


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(decode(v) for v in value)
    if isinstance(value, dict):
        (tag, payload), = value.items()
        if tag == "check":
            rule, dim, size, index = payload
            return Check(rule, dim, decode(size), index)
        if tag == "size":
            return parse(payload)
        return _DECODERS[tag](payload)
    return value


_INSTR_TAGS = {cls.__name__: cls for cls in Instr.__args__}


def _record(obj: Any) -> dict:
    return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def to_dict(p: HostProgram) -> dict:
    """JSON-compatible data (tensor constants by name only: see constants_blob)."""
    opaque = [name for name, v in p.constants.items() if not isinstance(v, torch.Tensor)]
    if opaque:
        kinds = ", ".join(f"{n} ({type(p.constants[n]).__name__})" for n in opaque)
        raise ValueError(f"kiln: the host program holds objects that cannot be serialized: {kinds}")
    for ins in p.body:
        if isinstance(ins, LaunchUser):
            try:
                find_user_kernel(ins.kernel, ins.digest)
            except LookupError as error:
                raise ValueError(f"kiln: the host program cannot be stored: {error}") from error
    return {
        "version": FORMAT_VERSION,
        "device": p.device,
        "launch_abi": p.launch_abi,
        "num_args": p.num_args,
        "inputs": [_record(s) for s in p.inputs],
        "kernels": encode(p.kernels),
        "arena": [_record(s) for s in p.arena],
        "checks": encode(p.checks),
        "constants": sorted(p.constants),
        "body": [{"instr": type(ins).__name__, **_record(ins)} for ins in p.body],
        "sizes": [_record(b) for b in p.sizes],
    }


def constants_blob(p: HostProgram) -> bytes:
    """The program's tensor constants as plain tensors (torch.save of a dict of tensors)."""
    buffer = io.BytesIO()
    torch.save({name: v.detach().clone() for name, v in p.constants.items()}, buffer)
    return buffer.getvalue()


def from_dict(data: dict, constants: bytes | None = None) -> HostProgram:
    if data.get("version") != FORMAT_VERSION:
        raise ValueError(f"kiln: host program format {data.get('version')!r}, "
                         f"this kiln reads {FORMAT_VERSION}")
    unknown = sorted({r["instr"] for r in data["body"]} - set(_INSTR_TAGS))
    if unknown:
        raise ValueError(f"kiln: the host program has instructions this kiln does not know: {unknown}")
    values = torch.load(io.BytesIO(constants), weights_only=True) if constants else {}
    missing = set(data["constants"]) - set(values)
    if missing:
        raise ValueError(f"kiln: the host program's constants {sorted(missing)} are missing from the blob")

    def build(cls, record: dict):
        return cls(**{k: decode(v) for k, v in record.items()})

    body = tuple(build(_INSTR_TAGS[r["instr"]], {k: v for k, v in r.items() if k != "instr"})
                 for r in data["body"])
    return HostProgram(
        device=data["device"], launch_abi=data["launch_abi"], num_args=data["num_args"],
        inputs=tuple(build(InputSpec, r) for r in data["inputs"]), body=body,
        kernels=decode(data["kernels"]), arena=tuple(build(Slot, r) for r in data["arena"]),
        checks=decode(data["checks"]), constants={name: values[name] for name in data["constants"]},
        sizes=tuple(build(SizeBinding, r) for r in data.get("sizes", ())),
    )


def is_literal(value: Any) -> bool:
    """Whether a value can be written into the program as is (else it becomes a constant)."""
    try:
        encode(value)
    except ValueError:
        return False
    return True

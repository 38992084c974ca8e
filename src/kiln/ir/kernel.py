"""kiln IR level 2: kernels as explicit data that every code generator renders.

A kernel iterates an outer domain (the parallel dimensions x0, x1, ...). Inside, it runs
stages in order. A loop stage iterates the reduction domain (r0, r1, ...) and may
accumulate reductions; a row stage runs once per outer point (after the reductions it reads).
Values are named SSA-style; an accumulator becomes a plain value after its stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Union

import sympy
import torch

from kiln.ir.checks import Check
from kiln.ir.index import Expr, Sym
from kiln.ir.sizes import Size, is_symbolic, simplify, size_symbol
from kiln.ir.tensor import dtype_name


@dataclass(frozen=True)
class Load:
    out: str
    buf: str
    index: Expr
    dtype: torch.dtype  # the buffer's storage dtype
    mask: str | None = None  # when false, the load is skipped and yields 0


@dataclass(frozen=True)
class Const:
    out: str
    value: float | int | bool
    dtype: torch.dtype


@dataclass(frozen=True)
class IndexValue:
    """The value of an index expression, as an int64."""

    out: str
    index: Expr


@dataclass(frozen=True)
class InBounds:
    """bool: 0 <= index < size."""

    out: str
    index: Expr
    size: Size


@dataclass(frozen=True)
class Compute:
    out: str
    fn: str
    args: tuple[str, ...]
    # the result's dtype. bf16/f16 values are held in float32 and rounded to their dtype
    # after each op that is not exact on them, as eager rounds them.
    dtype: torch.dtype


@dataclass(frozen=True)
class Reduce:
    """Accumulate value into out over the loop stage. For argmax/argmin, index is the
    position within the reduction domain, and out holds the winning index."""

    out: str
    kind: str
    value: str
    dtype: torch.dtype  # of the value being reduced
    index: Expr | None = None


@dataclass(frozen=True)
class Store:
    buf: str
    index: Expr
    value: str
    dtype: torch.dtype  # the buffer's storage dtype


@dataclass(frozen=True)
class Flag:
    """Where cond holds, report check `site` of the kernel (Kernel.checks) with `value` to the
    host, which raises after the launches (ir/checks.py). The kernel goes on: whatever reads
    the offending value must be made safe by the statements around this one."""

    cond: str
    value: str
    site: int


Stmt = Union[Load, Const, IndexValue, InBounds, Compute, Reduce, Store, Flag]


@dataclass(frozen=True)
class Stage:
    loop: bool  # True: runs over the reduction domain; False: once per outer point
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Param:
    name: str
    dtype: torch.dtype
    is_output: bool


@dataclass(frozen=True)
class Scratch:
    """A row-sized local array (one per outer point): a value computed in one loop stage
    and read again by later stages is kept here instead of being recomputed."""

    name: str
    dtype: torch.dtype  # a compute dtype


@dataclass(frozen=True)
class Kernel:
    name: str
    outer: tuple[Sym, ...]
    reduce: tuple[Sym, ...]
    params: tuple[Param, ...]  # named in0.., out0.. in order of first use
    stages: tuple[Stage, ...]
    scratch: tuple[Scratch, ...] = ()
    args: tuple[str, ...] = ()  # the host program's buffer passed for each param
    # what each Flag site reports; a kernel with checks takes its error buffer as its last param
    checks: tuple[Check, ...] = ()
    # the size symbols of a shape family the kernel computes with, in the order of its size
    # parameters (after the buffers), which its body names ks0, ks1, ... (size_params)
    sizes: tuple[Size, ...] = ()

    @property
    def outer_numel(self) -> Size:
        n = 1
        for s in self.outer:
            n *= s.extent
        return simplify(n)

    @property
    def reduce_numel(self) -> Size:
        n = 1
        for s in self.reduce:
            n *= s.extent
        return simplify(n)

    @property
    def is_reduction(self) -> bool:
        return any(isinstance(s, Reduce) for st in self.stages for s in st.body)


# Functions exact on bf16/f16 values: their results need no rounding back to the dtype.
EXACT_IN_LOW_PRECISION = frozenset("neg abs maximum minimum where sign cast floor ceil round trunc".split())


def only_stored(kernel: Kernel) -> set[str]:
    """Results of a kernel that no statement computes with and that are stored only into
    buffers of their own dtype: a renderer may leave their rounding to the store's conversion."""
    scratch = {sc.name for sc in kernel.scratch}
    dtypes = {s.out: s.dtype for st in kernel.stages for s in st.body if isinstance(s, Compute)}
    used = set()
    for st in kernel.stages:
        for s in st.body:
            if isinstance(s, Compute):
                used.update(s.args)
            elif isinstance(s, Reduce):
                used.add(s.value)
            elif isinstance(s, Load) and s.mask is not None:
                used.add(s.mask)
            elif isinstance(s, Flag):
                used.update((s.cond, s.value))
            elif isinstance(s, Store) and (s.buf in scratch or s.dtype != dtypes.get(s.value)):
                used.add(s.value)
            index = getattr(s, "index", None)
            if index is not None:
                used.update(sym.name for sym in index.symbols())
    return set(dtypes) - used


def rounds_result(s: Compute) -> bool:
    """Whether a renderer must round this result to its bf16/f16 dtype (the rule above)."""
    return s.dtype in (torch.bfloat16, torch.float16) and s.fn not in EXACT_IN_LOW_PRECISION


def column_reduction(kernel: Kernel) -> bool:
    """True when neighbouring outer points are neighbours in memory and neighbouring row
    elements are not (a sum over rows, like a bias gradient): code generators then work on
    a block of neighbouring outer points at once, so that loads stay contiguous."""
    if not kernel.reduce or not kernel.outer or kernel.scratch:  # rows kept: walked row by row
        return False
    x, r = kernel.outer[-1], kernel.reduce[-1]
    loads = [s.index for st in kernel.stages for s in st.body if isinstance(s, Load)]
    # a value per row (a norm's mean in its backward) is the same for the whole block
    along_rows = any(i.coef(r) == 1 and i.coef(x) != 0 for i in loads)
    # a shape family's stride (a size parameter) counts as more than 1
    across_rows = any(i.coef(x) == 1 and (is_symbolic(i.coef(r)) or i.coef(r) > 1) for i in loads)
    return across_rows and not along_rows


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type a value is held in while computing: low-precision floats widen to float32."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _stmt_str(s: Stmt) -> str:
    if isinstance(s, Load):
        mask = f", mask={s.mask}" if s.mask else ""
        return f"{s.out} = load {s.buf}[{s.index}]{mask}"
    if isinstance(s, Const):
        return f"{s.out} = const {s.value!r} : {dtype_name(s.dtype)}"
    if isinstance(s, IndexValue):
        return f"{s.out} = index {s.index}"
    if isinstance(s, InBounds):
        return f"{s.out} = 0 <= {s.index} < {s.size}"
    if isinstance(s, Compute):
        return f"{s.out} = {s.fn}({', '.join(s.args)}) : {dtype_name(s.dtype)}"
    if isinstance(s, Reduce):
        at = f" at {s.index}" if s.index is not None else ""
        return f"{s.out} = reduce.{s.kind}({s.value}){at}"
    if isinstance(s, Flag):
        return f"flag {s.site} if {s.cond} with {s.value}"
    return f"store {s.buf}[{s.index}] = {s.value}"


def size_param(k: int) -> sympy.Symbol:
    return size_symbol(f"ks{k}")


def size_params(kernel: Kernel) -> Kernel:
    """The kernel with the shape family's symbols it computes with renamed ks0, ks1, ... (in
    order of first use) and listed in Kernel.sizes: kernels of different graphs doing the
    same work have one text, one source and one build, and take their sizes at launch."""
    found: list[sympy.Symbol] = []

    def collect(value: Any) -> None:
        if isinstance(value, sympy.Basic):
            found.extend(s for s in sorted(value.free_symbols, key=str) if s not in found)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                collect(getattr(value, f.name))
        elif isinstance(value, tuple):
            for v in value:
                collect(v)

    collect(dataclasses.replace(kernel, sizes=(), checks=()))  # a check's size is for its message
    if not found:
        return kernel
    mapping = {s: size_param(i) for i, s in enumerate(found)}
    renamed = _rename(dataclasses.replace(kernel, sizes=(), checks=()), mapping)
    return dataclasses.replace(renamed, sizes=tuple(found), checks=kernel.checks)


def _rename(value: Any, mapping: dict) -> Any:
    if isinstance(value, sympy.Basic):
        return simplify(value.xreplace(mapping))
    if isinstance(value, Expr):  # terms are sorted by their text, which renaming changes
        from kiln.ir.index import as_expr

        out = as_expr(_rename(value.const, mapping))
        for atom, c in value.terms:
            out = out + as_expr(_rename(atom, mapping)) * _rename(c, mapping)
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _rename(getattr(value, f.name), mapping) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple):
        return tuple(_rename(v, mapping) for v in value)
    return value


def kernel_str(k: Kernel) -> str:
    members = getattr(k, "members", ())  # a group (ir/group.py): its members, each as a kernel
    if members:
        return "\n".join([f"group {k.name}({len(members)} kernels)"] + [kernel_str(m) for m in members])
    dims = lambda syms: ", ".join(f"{s.name} < {s.extent}" for s in syms)  # noqa: E731
    params = ", ".join(f"{'out ' if p.is_output else ''}{p.name}: {dtype_name(p.dtype)}" for p in k.params)
    if k.sizes:
        params += ", " + ", ".join(f"ks{i}: size" for i in range(len(k.sizes)))
    lines = [f"kernel {k.name}({params})", f"  outer: {dims(k.outer) or '()'}"]
    header = getattr(k, "template_header", None)  # a matmul (ir/matmul.py): its product's lines
    if header is not None:
        lines.extend(header())
    if k.reduce:
        lines.append(f"  reduce: {dims(k.reduce)}")
    for i, check in enumerate(k.checks):
        lines.append(f"  check {i}: {check}")
    for sc in k.scratch:
        lines.append(f"  scratch {sc.name}: {dtype_name(sc.dtype)}[{k.reduce_numel}]")
    for i, st in enumerate(k.stages):
        lines.append(f"  stage {i} ({'loop' if st.loop else 'row'}):")
        lines.extend(f"    {_stmt_str(s)}" for s in st.body)
    return "\n".join(lines)

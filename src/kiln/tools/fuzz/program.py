"""A fuzz program as data: typed inputs, statements over named values, outputs; rendered as
plain PyTorch source that a person can paste and run (no kiln import needed to rebuild it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
INT_DTYPES = ("int32", "int64")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
LAYOUTS = ("contiguous", "transposed", "strided", "expanded")

# A denormal of each floating dtype: inputs carry one where `specials` is set.
DENORMAL = {"float32": 1e-40, "float16": 1e-6, "bfloat16": 1e-39}


@dataclass(frozen=True)
class InputSpec:
    """One input tensor. kind "value": random values of dtype; "index": int64 in [0, high);
    "perm": int64, distinct values of [0, high) (no duplicate writes). layout "expanded"
    expands the dims in expand_dims from size 1; specials puts NaN/inf/-0.0/denormals at
    special_at (flat positions, taken modulo the element count)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    seed: int
    kind: str = "value"
    high: int = 0
    layout: str = "contiguous"
    expand_dims: tuple[int, ...] = ()
    special_at: tuple[int, ...] = ()
    grad: bool = False


@dataclass(frozen=True)
class Stmt:
    """`target = fmt.format(*args)`; target "" for a statement run for its effect (an in-place
    update of args[0])."""

    target: str
    fmt: str
    args: tuple[str, ...]

    def source(self) -> str:
        expr = self.fmt.format(*self.args)
        return f"{self.target} = {expr}" if self.target else expr


@dataclass(frozen=True)
class Program:
    seed: int
    index: int
    inputs: tuple[InputSpec, ...]
    stmts: tuple[Stmt, ...]
    outputs: tuple[str, ...]
    grad: bool = False
    exact: frozenset[str] = field(default=frozenset())  # values every compiler computes bit for bit

    def with_(self, **changes) -> Program:
        return replace(self, **changes)

    @property
    def name(self) -> str:
        return f"seed {self.seed} program {self.index}"


def _base_shape(spec: InputSpec) -> tuple[int, ...]:
    if spec.layout == "transposed":
        return tuple(reversed(spec.shape))
    if spec.layout == "strided":
        return tuple(2 * s + 1 for s in spec.shape)
    if spec.layout == "expanded":
        return tuple(1 if d in spec.expand_dims else s for d, s in enumerate(spec.shape))
    return spec.shape


def _layout_suffix(spec: InputSpec) -> str:
    rank = len(spec.shape)
    if spec.layout == "transposed" and rank >= 2:
        return f".permute({', '.join(str(d) for d in reversed(range(rank)))})"
    if spec.layout == "strided" and rank >= 1:
        return "[" + ", ".join("1::2" for _ in spec.shape) + "]"
    if spec.layout == "expanded" and spec.expand_dims:
        return f".expand({', '.join(str(s) for s in spec.shape)})"
    return ""


def _special_values(dtype: str) -> list[str]:
    return ["float('nan')", "float('inf')", "-float('inf')", "-0.0", repr(DENORMAL[dtype])]


def render_input(spec: InputSpec) -> list[str]:
    """Source lines that build one input from its own seed."""
    shape = ", ".join(str(s) for s in _base_shape(spec)) + ("," if len(spec.shape) == 1 else "")
    gen = f"generator=torch.Generator().manual_seed({spec.seed})"
    n, lines = spec.name, []
    if spec.kind == "index":
        lines.append(f"{n} = torch.randint(0, {spec.high}, ({shape}), {gen})")
    elif spec.kind == "perm":
        lines.append(f"{n} = torch.randperm({spec.high}, {gen})[:{spec.shape[0]}]")
    elif spec.dtype in FLOAT_DTYPES:
        lines.append(f"{n} = torch.randn(({shape}), {gen}).to(torch.{spec.dtype})")
    elif spec.dtype == "bool":
        lines.append(f"{n} = torch.rand(({shape}), {gen}) < 0.5")
    else:
        lines.append(f"{n} = torch.randint(-20, 20, ({shape}), {gen}, dtype=torch.{spec.dtype})")
    numel = math.prod(_base_shape(spec))
    if spec.special_at and numel and spec.dtype in FLOAT_DTYPES and spec.kind == "value":
        values = _special_values(spec.dtype)
        at = sorted({p % numel for p in spec.special_at})
        vals = ", ".join(values[k % len(values)] for k in range(len(at)))
        lines.append(f"{n}.view(-1)[{at}] = torch.tensor([{vals}]).to({n}.dtype)")
    suffix = _layout_suffix(spec)
    if suffix:
        lines.append(f"{n} = {n}{suffix}")
    if spec.grad:
        lines.append(f"{n} = {n}.detach().requires_grad_()")
    return lines


def render_inputs(program: Program) -> str:
    body = [line for spec in program.inputs for line in render_input(spec)]
    names = ", ".join(s.name for s in program.inputs)
    return "\n".join(["def make_inputs():", *("    " + b for b in body), f"    return [{names}]"])


def render_function(program: Program) -> str:
    params = ", ".join(s.name for s in program.inputs)
    body = [s.source() for s in program.stmts]
    outs = ", ".join(program.outputs) + ("," if len(program.outputs) == 1 else "")
    return "\n".join([f"def f({params}):", *("    " + b for b in body), f"    return ({outs})"])


def render(program: Program) -> str:
    """The program's self-contained source: `import torch`, f, make_inputs."""
    return "\n\n".join(["import torch", render_function(program), render_inputs(program)]) + "\n"


def reproducer(program: Program, compile_line: str = "kiln.compile(f)") -> str:
    """Source a person pastes: builds inputs, runs eager and compiled, prints the outputs."""
    tail = [
        "",
        "import kiln  # noqa: E402",
        "",
        "expected = f(*make_inputs())",
        f"actual = {compile_line}(*make_inputs())",
        "for e, a in zip(expected, actual):",
        "    print(e, a, sep='\\n')",
    ]
    return render(program) + "\n".join(tail) + "\n"


def load(program: Program) -> dict:
    """exec the program's source: a namespace with f and make_inputs."""
    namespace: dict = {}
    exec(compile(render(program), f"<fuzz {program.name}>", "exec"), namespace)  # noqa: S102 - our own source
    return namespace


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)

"""The numerics check: every kernel of a graph held against its own tensor-IR ops.

With Options.check (kiln.compile(..., check=True), KILN_CHECK=1, `python -m kiln check`), a
graph is compiled without the graph cache and keeps what each launch computes in tensor IR
(passes/pipeline.py's LaunchGraphs). Its first call runs the host program with every launch
wrapped: after a kernel runs, its tensor-IR sub-graph is evaluated from the kernel's own input
buffers (ir/evaluate.py) twice, in float64 and in the nodes' own dtypes, and each output the
kernel stored is compared:

- floats: |kernel - float64| <= 4 x the own-dtype evaluation's RMS error against float64 (or
  4 x the element's rounding noise, where larger: how far float64 evaluations with every op
  perturbed by an ulp move it) + 8 ulps (of the narrowest float computed with) of the values'
  scale (their largest magnitude); an element equal to the own-dtype evaluation's, or
  non-finite where a reference is the same, passes;
- integers and booleans: equal to one of the two evaluations.

The first kernel over tolerance is named, with its ops, kernel IR, source and the model code it
came from, in one warning and in the compile report (report.numerics); tools/bisect.py then
looks for the fusion decision or the op that changes its result. Later calls run the program
unwrapped. The check holds kernels against the tensor IR: a lowering whose meaning differs
from ATen's is not caught here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kiln.codegen import host as host_codegen
from kiln.frontend.origin import ORIGIN
from kiln.ir.evaluate import evaluate, largest_tensor, subgraph
from kiln.ir.host import Launch
from kiln.ir.kernel import kernel_str
from kiln.ir.tensor import Node, Op, dtype_name, node_str, type_str

log = logging.getLogger("kiln")

# A kernel whose sub-graph holds a tensor larger than this is not evaluated (time, memory).
ELEMENT_LIMIT = 2**24
RMS_FACTOR = 4.0
ULPS = 8.0
NOISY_EVALUATIONS = 2

# Every check's report in this process, newest last (what `python -m kiln check` reads).
RESULTS: list[NumericsReport] = []


@dataclass(frozen=True)
class OutputError:
    """How far one stored output of a launch is from its float64 evaluation."""

    buffer: str
    dtype: torch.dtype
    max_error: float  # floats: the largest |kernel - float64|; integers: elements unequal
    tolerance: float
    bad_elements: int
    numel: int

    @property
    def over(self) -> bool:
        return self.bad_elements > 0


@dataclass(frozen=True)
class KernelMismatch:
    """A launch over tolerance, with what a person needs to find why."""

    kernel: str
    output: OutputError
    ops: str  # the tensor-IR sub-graph
    kernel_ir: str
    source: str
    model_code: tuple[str, ...]
    roots: tuple[Node, ...] = field(compare=False, repr=False)
    given: dict = field(compare=False, repr=False)  # input node -> the kernel's input tensor


@dataclass
class NumericsReport:
    """The result of one graph's checked first call."""

    checked: int = 0  # launches compared
    skipped: list[str] = field(default_factory=list)  # launches not compared, with the reason
    mismatches: list[KernelMismatch] = field(default_factory=list)
    bisection: str = ""  # tools/bisect.py's finding for the first mismatch

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def kernel(self) -> str | None:
        return self.mismatches[0].kernel if self.mismatches else None

    @property
    def max_error(self) -> float:
        return self.mismatches[0].output.max_error if self.mismatches else 0.0

    @property
    def tolerance(self) -> float:
        return self.mismatches[0].output.tolerance if self.mismatches else 0.0

    @property
    def text(self) -> str:
        head = f"kiln numerics check: {self.checked} launches compared"
        if self.skipped:
            head += f", {len(self.skipped)} skipped (" + "; ".join(self.skipped[:3]) + \
                ("; ..." if len(self.skipped) > 3 else "") + ")"
        if self.ok:
            return head + ", all within tolerance"
        first = self.mismatches[0]
        out = first.output
        what = (f"max error {out.max_error:.3g} > tolerance {out.tolerance:.3g}"
                if out.dtype.is_floating_point else "integers differ")
        lines = [
            f"{head}; {len(self.mismatches)} over tolerance. First: {first.kernel} writes {out.buffer} "
            f"({dtype_name(out.dtype)}) with {what} ({out.bad_elements} of {out.numel} elements)",
            "model code:",
            *(f"  {line}" for line in (first.model_code or ("<no stack trace in the FX graph>",))),
            "tensor IR of the kernel:",
            *(f"  {line}" for line in first.ops.splitlines()),
            "kernel IR:",
            *(f"  {line}" for line in first.kernel_ir.splitlines()),
            "source:",
            *(f"  {line}" for line in first.source.splitlines()),
        ]
        if self.bisection:
            lines += ["bisection:", *(f"  {line}" for line in self.bisection.splitlines())]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text


# ---- comparison ------------------------------------------------------------------------------


def compare(actual: torch.Tensor, wide: torch.Tensor, own: torch.Tensor, buffer: str = "",
            eps: float | None = None, ulps: float = ULPS, noise: torch.Tensor | None = None) -> OutputError:
    """The kernel's values against the float64 and own-dtype evaluations (rules above). eps:
    the ulp (relative) of the narrowest float the values went through; the output's own when
    None. noise: each element's rounding noise (how far perturbed evaluations moved it)."""
    dtype = actual.dtype
    numel = actual.numel()
    if not dtype.is_floating_point:
        bad = (actual != wide.to(dtype)) & (actual != own)
        count = int(bad.sum())
        return OutputError(buffer, dtype, float(count), 0.0, count, numel)
    a, w, o = actual.double(), wide.double(), own.double()
    eps = torch.finfo(dtype).eps if eps is None else eps
    error = (a - w).abs()
    finite = torch.isfinite(w) & torch.isfinite(o)
    own_error = (o - w)[finite]
    rms = float(own_error.square().mean().sqrt()) if own_error.numel() else 0.0
    scale = float(w[finite].abs().max()) if bool(finite.any()) else 0.0
    ulp_part = ulps * eps * scale
    if noise is None and bool(finite.all()):  # the common case, in fewer passes over the data
        max_error = float(error.max()) if numel else 0.0
        if max_error <= RMS_FACTOR * rms + ulp_part:
            return OutputError(buffer, dtype, max_error, RMS_FACTOR * rms + ulp_part, 0, numel)
    allowed = torch.full_like(w, RMS_FACTOR * rms)
    if noise is not None:
        allowed = torch.maximum(allowed, RMS_FACTOR * torch.nan_to_num(noise.double(), nan=0.0, posinf=0.0))
    allowed = allowed + ulp_part
    same_as_own = (a == o) | (torch.isnan(a) & torch.isnan(o))
    same_as_wide = (a == w) | (torch.isnan(a) & torch.isnan(w))
    within = torch.where(torch.isfinite(w), error <= allowed, same_as_wide)
    bad = ~(within | same_as_own)
    finite_error = torch.isfinite(w) & torch.isfinite(a)
    measured = error[finite_error]
    max_error = float(measured.max()) if measured.numel() else 0.0
    # the tolerance at the element furthest over it (at the largest error when none is)
    excess = torch.where(finite_error, error - allowed, torch.tensor(-math.inf, dtype=torch.float64))
    tolerance = float(allowed.flatten()[excess.flatten().argmax()]) if excess.numel() else ulp_part
    count = int(bad.sum())
    if count and not bool((finite_error & bad).any()):
        max_error = math.inf  # the bad elements are non-finite where the references are not
    return OutputError(buffer, dtype, max_error, tolerance, count, numel)


def check_launch(roots: list[Node], given: dict[Node, torch.Tensor],
                 outputs: dict[Node, torch.Tensor]) -> list[OutputError]:
    """Each stored output of a launch against the evaluation of its ops from the launch's inputs."""
    given = {n: t.detach().cpu() for n, t in given.items()}
    wide = evaluate(roots, given, wide=True)
    own = evaluate(roots, given, wide=False)
    eps, ulps = rounding_allowance(subgraph(roots, set(given)) + list(given))
    actual = {n: t.detach().cpu() for n, t in outputs.items()}
    errors = [compare(actual[n], wide[n], own[n], f"%{n.id}", eps, ulps) for n in outputs]
    if not any(e.over and e.dtype.is_floating_point for e in errors):
        return errors
    # only where the RMS rule fails is each element's own rounding noise measured
    generator = torch.Generator().manual_seed(0)
    noisy = [evaluate(roots, given, wide=True, noise=generator) for _ in range(NOISY_EVALUATIONS)]
    for k, n in enumerate(outputs):
        if errors[k].over and n.dtype.is_floating_point:
            noise = torch.stack([(v[n] - wide[n]).abs() for v in noisy]).amax(0)
            errors[k] = compare(actual[n], wide[n], own[n], f"%{n.id}", eps, ulps, noise)
    return errors


def rounding_allowance(nodes: list[Node]) -> tuple[float | None, float]:
    """The ulp and the number of ulps a kernel's rounding may cost beyond the own-dtype
    evaluation's: the ulp of the narrowest float the values pass through (a float64 output
    computed through float32 carries float32's rounding), and ULPS, times the square root of
    the longest product's length (a product's relative rounding errors add up along it, in
    an order the float64 evaluation of a float64 product does not share)."""
    floats = [n.dtype for n in nodes if n.dtype.is_floating_point]
    eps = max((torch.finfo(d).eps for d in floats), default=None)
    products = [math.prod(n.inputs[0].shape[a] for a in n.attrs[1]) for n in nodes
                if n.op is Op.REDUCE and n.attrs[0] == "prod"]
    return eps, ULPS * math.sqrt(max(products, default=1))


# ---- what a person reads ---------------------------------------------------------------------

def model_code(nodes: list[Node]) -> tuple[str, ...]:
    """The model code the nodes came from (the source map's origins, frontend/origin.py), in
    graph order, each line once."""
    lines: list[str] = []
    for n in nodes:
        origin = n.meta.get(ORIGIN)
        text = origin.text() if origin is not None else ""
        if text and text not in lines:
            lines.append(text)
    return tuple(lines)


def ops_text(roots: list[Node], given: set[Node]) -> str:
    inputs = sorted(given, key=lambda n: n.id)
    lines = [f"{n!r} : {type_str(n)}, read from a buffer" for n in inputs]
    lines += [node_str(n) for n in subgraph(roots, given)]
    lines.append(f"stored: {', '.join(repr(r) for r in roots)}")
    return "\n".join(lines)


# ---- the checked first call ------------------------------------------------------------------


class _Session:
    """One checked call: the launches in program order, checked as they run."""

    def __init__(self, report, launches: list[Launch]):
        self.report, self.launches = report, launches
        self.graphs = report.launches
        self.node_of = {name: node for node, name in self.graphs.buffer_names.items()}
        self.next = 0
        self.result = NumericsReport()

    def after_launch(self, kernel: str, tensors: tuple) -> None:
        launch = self.launches[self.next]
        self.next += 1
        if launch.kernel != kernel:
            raise RuntimeError(f"kiln numerics check: launch {self.next} runs {kernel}, "
                               f"expected {launch.kernel}")
        try:
            self._check(launch, tensors)
        except Exception as e:  # noqa: BLE001 - checking must not change what the program does
            self.result.skipped.append(f"{kernel}: not evaluated ({type(e).__name__}: {e})")

    def _check(self, launch: Launch, tensors: tuple) -> None:
        kernel = launch.kernel
        roots = self.graphs.roots.get((kernel, launch.args))
        if roots is None:
            self.result.skipped.append(f"{kernel}: no tensor IR kept for its launch")
            return
        by_name = dict(zip(launch.args, tensors))
        given = {self.node_of[a]: by_name[a] for a in launch.args if a not in launch.writes}
        outputs = {self.node_of[a]: by_name[a] for a in launch.writes}
        elements = largest_tensor(roots, given)
        if elements > ELEMENT_LIMIT:
            self.result.skipped.append(f"{kernel}: a tensor of {elements} elements (over {ELEMENT_LIMIT})")
            return
        errors = check_launch(roots, given, outputs)
        self.result.checked += 1
        names = {self.node_of[a]: a for a in launch.writes}
        for node, err in zip(outputs, errors):
            if err.over:
                err = dataclasses.replace(err, buffer=names[node])
                self.result.mismatches.append(self._mismatch(kernel, err, roots, given))
                break

    def _mismatch(self, kernel: str, err: OutputError, roots: list[Node], given: dict) -> KernelMismatch:
        kern = next((k for k in self.report.kernels if k.name == kernel), None)
        nodes = subgraph(roots, set(given))
        return KernelMismatch(
            kernel, err, ops_text(roots, set(given)), kernel_str(kern) if kern else "",
            self.report.sources.get(kernel, ""), model_code(nodes), tuple(roots),
            {n: t.detach().clone() for n, t in given.items()},
        )


class _CheckedLauncher:
    """A launcher taking tensors that runs the real one, then has the session check it."""

    def __init__(self, name: str, launcher: Callable, pointers: bool, session: _Session,
                 aligned: bool = False):
        self.name, self.launcher, self.pointers, self.session = name, launcher, pointers, session
        self.entry = getattr(launcher, "aligned", launcher) if aligned else launcher
        if not aligned:
            self.aligned = _CheckedLauncher(name, launcher, pointers, session, aligned=True)

    def __call__(self, *tensors: torch.Tensor) -> None:
        if self.pointers:
            self.entry(*[t.data_ptr() for t in tensors])
        else:
            self.entry(*tensors)
        args = tensors[: len(self.session.launches[self.session.next].args)]
        self.session.after_launch(self.name, args)


def checked_call(report) -> tuple[Callable[[list], list], _Session]:
    """The report's host program, with launchers taking tensors and checked after each launch."""
    program = report.host_program
    pointers = program.launch_abi == "pointers"
    as_tensors = dataclasses.replace(program, launch_abi="tensors")
    launches = [i for i in program.body if isinstance(i, Launch)]
    session = _Session(report, launches)
    launchers = {name: _CheckedLauncher(name, fn, pointers, session)
                 for name, fn in report.launches.launchers.items()}
    return host_codegen.load(as_tensors, launchers), session


class CheckedProgram:
    """A compiled program (boxed) whose first call is checked (module docstring); the report
    gets the result as report.numerics, and an over-tolerance kernel one warning."""

    _boxed_call = True

    def __init__(self, fn: Callable, report):
        self.fn, self.report, self.pending = fn, report, True

    def __call__(self, args: list) -> Any:
        if not self.pending:
            return self.fn(args)
        self.pending = False
        try:
            call, session = checked_call(self.report)
        except Exception as e:  # noqa: BLE001 - the user's program must still run
            log.warning("kiln numerics check: the checked program did not load (%s: %s); run unchecked",
                        type(e).__name__, e)
            return self.fn(args)
        out = call(args)
        self.finish(session.result)
        return out

    def finish(self, result: NumericsReport) -> None:
        report = self.report
        if result.mismatches:
            from kiln.tools.bisect import bisect_mismatch

            try:
                result.bisection = bisect_mismatch(result.mismatches[0], report.launches)
            except Exception as e:  # noqa: BLE001 - a failed bisection still leaves the finding
                result.bisection = f"bisection failed: {type(e).__name__}: {e}"
        report.numerics = result
        report.launches = None  # the graph and launchers were kept only for this call
        RESULTS.append(result)
        if result.mismatches:
            log.warning("%s", result.text)
        else:
            log.info("%s", result.text)


def compile_checked(gm, example_inputs: list[Any], options, target: str, backend):
    """compile_graph for a checked graph: per shape, past the graph cache (which keeps no
    tensor IR), its first call checked."""
    from kiln.passes.pipeline import compile_graph

    fn, report = compile_graph(gm, example_inputs, backend, check=True)
    return CheckedProgram(fn, report), report

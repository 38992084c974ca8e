"""Run one fuzz program: eager, a float64 reference, and the compiler under test (kiln, or
Inductor to calibrate the comparison); classify the outcome."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from kiln import errors
from kiln.tools.fuzz.compare import Run, compare_runs, grad_targets
from kiln.tools.fuzz.program import Program, load

# Outcome classes. Failures: the compiler raised, kiln fell back on an internal error (or
# AOTAutograd failed under kiln), or a result differs. The rest are counted, not failures.
# "upstream": the compiler raised, and so does Dynamo + AOTAutograd without it (aot_eager).
FAILURES = ("crash", "internal fallback", "mismatch")
CLASSES = FAILURES + ("upstream", "not captured", "fallback", "pass")


@dataclass
class Outcome:
    cls: str
    detail: str = ""
    fallbacks: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.cls in FAILURES

    def to_dict(self) -> dict:
        return asdict(self)


Compiler = Callable[[Callable], Callable]  # fn -> compiled fn


def compiler(against: str | Compiler) -> Compiler:
    """ "kiln" (KILN_TARGET picks C++ or Triton), "inductor", "eager" or "aot_eager" (what the
    fuzzer itself gets wrong shows there), or a compiler given as a function (tests)."""
    if callable(against):
        return against
    if against == "kiln":
        import kiln

        return kiln.compile
    backend = {"inductor": "inductor", "eager": "eager", "aot_eager": "aot_eager"}[against]
    return lambda fn: torch.compile(fn, backend=backend)


def execute(fn: Callable, inputs: list, program: Program) -> Run:
    outs = fn(*inputs)
    grads = grad_nan = None
    if program.grad:
        targets = grad_targets(outs, inputs, program.seed)
        if targets is not None:
            sel, wrt, cots = targets
            cots = [c.to(o.dtype) for c, o in zip(cots, sel)]
            grads = list(torch.autograd.grad(sel, wrt, cots, allow_unused=True))
            grad_nan = [x.detach().isnan() for x in wrt]

    def detach(ts):
        return [t.detach() if isinstance(t, torch.Tensor) else t for t in ts]

    return Run(detach(outs), detach(inputs), None if grads is None else detach(grads), grad_nan)


def reference(ns: dict, program: Program) -> Run | None:
    """The program in float64 (floating inputs and the default dtype), or None if it cannot."""
    inputs = []
    for x in ns["make_inputs"]():
        if x.is_floating_point():
            x = x.detach().double().requires_grad_(x.requires_grad)
        inputs.append(x)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return execute(ns["f"], inputs, program)
    except Exception:  # noqa: BLE001 - e.g. an explicit cast makes dtypes disagree in float64
        return None
    finally:
        torch.set_default_dtype(default)


def run_program(program: Program, against: str | Compiler = "kiln") -> Outcome:
    t0 = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = _run(program, against)
    outcome.seconds = round(time.time() - t0, 3)
    return outcome


def _run(program: Program, against: str | Compiler) -> Outcome:
    ns = load(program)
    expected = execute(ns["f"], ns["make_inputs"](), program)
    ref = reference(ns, program)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    errors.FALLBACKS.clear()
    try:
        compiled = compiler(against)(ns["f"])
        actual = execute(compiled, ns["make_inputs"](), program)
        # a second call runs what the first compiled and cached: state kept between calls shows
        again = execute(compiled, ns["make_inputs"](), program)
    except Exception as e:  # noqa: BLE001 - the compiler under test raised
        if isinstance(against, str) and against != "aot_eager" and _fails_without(ns, program, "aot_eager"):
            return Outcome("upstream", short(e))
        return Outcome("crash", short(e))
    records = list(errors.FALLBACKS)
    shown = sorted({f"{r.kind}: {r.op or 'graph'}" for r in records})
    bad = [r for r in records if r.kind in ("internal", "trace")]
    only_traced = bool(bad) and all(r.kind == "trace" for r in bad)
    if only_traced and _fails_without(ns, program, "aot_eager"):  # AOTAutograd refuses it without kiln too
        return Outcome("upstream", f"{bad[0].kind} {bad[0].op or 'graph'}: {bad[0].reason}"[:500], shown)
    if bad:
        return Outcome(
            "internal fallback", f"{bad[0].kind} {bad[0].op or 'graph'}: {bad[0].reason}"[:500], shown
        )
    exact = [n in program.exact for n in program.outputs] + [s.name in program.exact for s in program.inputs]
    why = compare_runs(actual, expected, ref, exact)
    why = why or _prefixed("second call: ", compare_runs(again, expected, ref, exact))
    if why:
        return _judge_mismatch(why, ns, program, expected, ref, exact, shown)
    breaks = torch._dynamo.utils.counters["graph_break"]
    if breaks:
        return Outcome("not captured", "; ".join(list(breaks)[:2])[:300], shown)
    upstream = [r for r in records if r.kind == "upstream"]
    if upstream:  # PyTorch's shape function disagrees with its kernel; the graph ran in ATen
        return Outcome("upstream", upstream[0].reason[:500], shown)
    return Outcome("fallback" if records else "pass", "", shown)


def _prefixed(prefix: str, why: str) -> str:
    return prefix + why if why else ""


def _judge_mismatch(
    why: str, ns: dict, program: Program, expected: Run, ref: Run | None, exact: list[bool], shown: list[str]
) -> Outcome:
    """A difference that Dynamo + AOTAutograd alone (aot_eager) show too is upstream, and so
    is one in strides alone where PyTorch's meta functions, which every compiler traces with,
    give other strides than eager's kernels (copysign of mixed layouts; Inductor's too)."""
    plain = _mismatch_without_kiln(ns, program, expected, ref, exact)
    if plain:
        return Outcome("upstream", f"{why} (aot_eager too: {plain})"[:500], shown)
    if " strides " in why and _meta_strides_differ(ns, expected):
        return Outcome("upstream", f"{why} (so do PyTorch's meta functions)"[:500], shown)
    return Outcome("mismatch", why, shown)


def _mismatch_without_kiln(
    ns: dict, program: Program, expected: Run, ref: Run | None, exact: list[bool]
) -> str:
    """How the program run by Dynamo and AOTAutograd alone differs from eager."""
    torch._dynamo.reset()
    try:
        run = execute(torch.compile(ns["f"], backend="aot_eager"), ns["make_inputs"](), program)
    except Exception:  # noqa: BLE001
        return ""
    return compare_runs(run, expected, ref, exact)


def _meta_strides_differ(ns: dict, expected: Run) -> bool:
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(x) for x in ns["make_inputs"]()]
            outs = ns["f"](*fakes)
            strides = [o.stride() for o in outs]
    except Exception:  # noqa: BLE001
        return False
    return any(s != e.stride() for s, e in zip(strides, expected.outputs) if e.numel())


def _fails_without(ns: dict, program: Program, against: str) -> bool:
    torch._dynamo.reset()
    try:
        execute(compiler(against)(ns["f"]), ns["make_inputs"](), program)
        return False
    except Exception:  # noqa: BLE001
        return True


def short(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".replace("\n", " ")[:500]

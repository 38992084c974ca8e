"""Readable accounts of what kiln did with a graph: passes, fusion decisions, fallbacks,
kernels, and what they cost. `kiln.explain(fn, *args)` compiles fn on args and returns an
Explanation: data (graphs, kernels with their costs, decisions, fallbacks, host programs,
break-even), whose str() is the text."""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kiln.frontend.origin import Origin
from kiln.ir.host import HostProgram
from kiln.ir.kernel import Kernel, kernel_str
from kiln.passes.cost import BreakEven, GraphCost, break_even
from kiln.passes.fusion import Decision
from kiln.passes.pipeline import CompileReport, PassRecord
from kiln.passes.roofline import Ceilings, Cost
from kiln.passes.source_map import SourceEntry, short_op


def kernel_summary(k) -> str:
    from kiln.ir.kernel import Reduce

    reductions = [s.kind for st in k.stages for s in st.body if isinstance(s, Reduce)]
    reads = [a for a, p in zip(k.args, k.params) if not p.is_output]
    stores = [a for a, p in zip(k.args, k.params) if p.is_output]
    dims = "x".join(str(s.extent) for s in k.outer) or "1"
    if k.reduce:
        dims += " rows of " + "x".join(str(s.extent) for s in k.reduce)
    fused = f", reductions fused: {', '.join(reductions)}" if reductions else ""
    return f"{k.name}: {dims}; reads {', '.join(reads) or '-'}; writes {', '.join(stores)}{fused}"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _flops(n: float) -> str:
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} FLOP"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def decision_origin(d: Decision, origins: dict[int, Origin]) -> Origin | None:
    """The model code a decision is about (decisions name their node "%<id> ...")."""
    match = re.match(r"%(\d+)", d.node)
    return origins.get(int(match.group(1))) if match else None


def decision_lines(decisions: list[Decision], origins: dict[int, Origin] | None = None) -> list[str]:
    """One line per decision, with the model code it is about; views passed without a copy
    fold into one line."""
    lines = []
    for d in decisions:
        if d.verdict == "alias":
            continue
        origin = decision_origin(d, origins or {})
        where = f" [{origin.short()}]" if origin is not None and origin.short() else ""
        lines.append(f"  {d.verdict:<7} {d.node}{where}: {d.reason}")
    aliases = sum(1 for d in decisions if d.verdict == "alias")
    if aliases:
        lines.append(f"  alias: {aliases} view{'s' if aliases > 1 else ''} passed without copy")
    return lines


def report_text(report: CompileReport, show_kernels: bool = False, show_source: bool = False) -> str:
    lines = ["passes:"]
    for p in report.passes:
        lines.append(f"  {p.name:<15} {p.seconds * 1e3:8.1f} ms  {p.summary}")
    if report.partition is not None:
        lines.append(report.partition.text())
    if getattr(report, "family", ""):  # one program for every size of the graph's shape family
        lines.append(f"shape family: {report.family}")
    if getattr(report, "graphs", None) is not None:
        lines.append(report.graphs.text())
    lines.append(f"kernels: {report.num_kernels}")
    for k in report.kernels:
        lines.append(f"  {kernel_summary(k)}")
        if k.name in report.source_map:
            lines.extend(report.source_map[k.name].lines())
    aten_calls = [e for e in report.source_map.values() if e.kind == "aten"]
    if aten_calls:
        lines.append(f"ATen calls: {len(aten_calls)}")
        for e in aten_calls:
            lines.append(f"  {e.name} = {', '.join(short_op(op) for op in e.ops) or 'ATen call'}")
            lines.extend(e.lines())
    verdicts = Counter(d.verdict for d in report.decisions)
    lines.append("decisions: " + ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items())))
    lines.extend(decision_lines(report.decisions, report.node_origins))
    reordered = [c for c in report.layouts if c.name != "contiguous"]
    if reordered:  # buffers in logical order are the rule; the others say why
        contiguous = len(report.layouts) - len(reordered)
        lines.append(f"layouts: {contiguous} buffers contiguous, {len(reordered)} not:")
        lines.extend(f"  {c}" for c in reordered)
    if report.fallbacks:
        lines.append("ran in ATen:")
        for op, why in sorted(report.fallbacks.items()):
            lines.append(f"  {op}: {why}")
    if show_kernels:
        lines.append("")
        lines.extend(kernel_str(k) + "\n" for k in report.kernels)
        if report.host_program is not None:
            lines.append(str(report.host_program) + "\n")
    if show_source:
        lines.append(report.host_source)
        for name, src in report.sources.items():  # C++ from its entry point; Triton whole
            lines.append(src[src.index('extern "C"'):] if 'extern "C"' in src else src)
    return "\n".join(lines)


@dataclass
class KernelCost:
    """One kernel: its IR, its predicted cost per launch and, measured, its time per launch."""

    kernel: Kernel
    cost: Cost | None
    launches: int = 1  # per call of the program
    measured_s: float | None = None
    source: SourceEntry | None = None  # the model code it computes

    @property
    def model_code(self) -> str:
        """The model code it came from, in one short line ("" if unknown)."""
        if self.source is None or not self.source.sites:
            return ""
        first = self.source.sites[0].origin.short()
        more = len(self.source.sites) - 1
        return first + (f" (+{more} more)" if more else "")

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def achieved(self) -> float | None:
        """The fraction of the roofline reached: predicted floor over measured time."""
        if self.cost is None or not self.measured_s:
            return None
        return self.cost.floor_s / self.measured_s

    def text(self) -> str:
        c = self.cost
        if c is None:
            return f"  {self.name}: no estimate"
        launches = f" x{self.launches}" if self.launches > 1 else ""
        line = (f"  {self.name}{launches}: must move {_bytes(c.must_move)}, moves {_bytes(c.moves)}, "
                f"{_flops(c.flops)}; predicted {_us(c.seconds)} ({c.bound})")
        if self.measured_s is not None:
            line += f", measured {_us(self.measured_s)}, {self.achieved:.0%} of the roofline"
        return line


@dataclass
class GraphExplanation:
    """One graph kiln compiled: what each pass did, the kernels and their costs, the fusion
    decisions, the ops left to ATen, the host program and when compiling it pays."""

    report: CompileReport
    kernels: list[KernelCost]
    cost: GraphCost | None
    break_even: BreakEven | None = None
    measured_s: float | None = None  # the kernels' measured time per call, summed
    show_kernels: bool = True
    show_source: bool = False

    @property
    def passes(self) -> list[PassRecord]:
        return self.report.passes

    @property
    def decisions(self) -> list[Decision]:
        return self.report.decisions

    @property
    def fallbacks(self) -> dict[str, str]:
        return self.report.fallbacks

    @property
    def host_program(self) -> HostProgram | None:
        return self.report.host_program

    @property
    def source_map(self) -> dict[str, SourceEntry]:
        """Kernel name or ATen call's buffer -> the ops it computes and their model code."""
        return self.report.source_map

    @property
    def aten_calls(self) -> list[SourceEntry]:
        return [e for e in self.report.source_map.values() if e.kind == "aten"]

    def decision_code(self) -> list[tuple[Decision, Origin | None]]:
        """Each decision with the model code it is about."""
        return [(d, decision_origin(d, self.report.node_origins)) for d in self.report.decisions]

    @property
    def compile_s(self) -> float:
        return self.report.seconds

    def cost_lines(self) -> list[str]:
        c = self.cost
        if c is None:
            return ["cost: no estimate for this graph"]
        lines = ["cost (per call, predicted" + (", measured" if self.measured_s is not None else "") + "):"]
        lines.extend(k.text() for k in self.kernels)
        if c.aten:
            aten_s = sum(a.seconds for a in c.aten)
            lines.append(f"  ATen calls x{len(c.aten)}: moves {_bytes(sum(a.moves for a in c.aten))}, "
                         f"{_flops(sum(a.flops for a in c.aten))}; predicted {_us(aten_s)}")
        lines.append(f"  total: moves {_bytes(c.moves)}, {_flops(c.flops)}; predicted {_us(c.seconds)}")
        if c.eager:
            lines.append(f"  against eager's ops: launches {c.eager_launches} -> {c.launches}, "
                         f"bytes {_bytes(c.eager_moves)} -> {_bytes(c.moves)}, predicted "
                         f"{_us(c.eager_seconds)} -> {_us(c.seconds)}")
        if self.break_even is not None:
            lines.append("  " + self.break_even.text(of="kiln's passes"))
        return lines

    def __str__(self) -> str:
        """report_text's, with the cost lines after the decisions and before any kernel IR."""
        short = report_text(self.report)
        full = report_text(self.report, self.show_kernels, self.show_source)
        return "\n".join([short, *self.cost_lines()]) + full[len(short):]


@dataclass
class Explanation:
    """What kiln.explain found: each graph compiled, and for the whole call (with
    measure=True) eager's and the compiled time and the compile's break-even."""

    graphs: list[GraphExplanation] = field(default_factory=list)
    compile_s: float = 0.0  # the first call's wall time less one call: Dynamo, AOTAutograd, kiln
    eager_s: float | None = None  # measured, per call
    compiled_s: float | None = None  # measured, per call
    break_even: BreakEven | None = None
    ceilings: Ceilings | None = None
    memory: Any = None  # passes/peak.py's PeakMemory of the call: the peak and what is live at it

    @property
    def kernels(self) -> list[KernelCost]:
        """Every graph's kernels, with their costs and model code."""
        return [k for g in self.graphs for k in g.kernels]

    @property
    def decisions(self) -> list[Decision]:
        return [d for g in self.graphs for d in g.decisions]

    @property
    def fallbacks(self) -> dict[str, str]:
        """ATen op -> why it runs in ATen, over every graph."""
        return {op: why for g in self.graphs for op, why in g.fallbacks.items()}

    @property
    def source_map(self) -> dict[str, SourceEntry]:
        """Kernel name or ATen call's buffer -> its model code, over every graph ("g1:buf3"
        from the second graph on, where names repeat across graphs)."""
        out: dict[str, SourceEntry] = {}
        for i, g in enumerate(self.graphs):
            out.update({(name if i == 0 else f"g{i}:{name}"): e for name, e in g.source_map.items()})
        return out

    def save_html(self, path, title: str = "kiln report"):
        """Write one self-contained HTML page (tools/report_html.py); returns its path."""
        from kiln.tools.report_html import save_html

        return save_html(self, path, title)

    def __contains__(self, text: str) -> bool:
        """`"kernel0" in kiln.explain(...)` reads the text, as when explain returned it."""
        return text in str(self)

    def __str__(self) -> str:
        if not self.graphs:
            return "kiln compiled no graph (everything ran in eager or ATen; see the log)"
        parts = [f"== graph {i} ==\n{g}" for i, g in enumerate(self.graphs)]
        lines = []
        if self.eager_s is not None and self.compiled_s is not None:
            lines.append(f"measured per call: eager {_us(self.eager_s)}, kiln {_us(self.compiled_s)} "
                         f"({self.eager_s / self.compiled_s:.2f}x)")
        if self.break_even is not None:
            lines.append(self.break_even.text(of="first call: Dynamo, AOTAutograd and kiln"))
        if self.ceilings is not None:
            c = self.ceilings
            lines.append(f"ceilings ({c.device}): copy {c.copy_bytes_per_s / 1e9:.1f} GB/s, element-wise "
                         f"{c.ops_per_s / 1e9:.1f} Gop/s, matmul {c.matmul_flop_per_s / 1e12:.2f} TFLOP/s, "
                         f"launch {_us(c.launch_s)}")
        if self.memory is not None:
            lines.append(self.memory.text())
        return "\n\n".join(parts + (["\n".join(lines)] if lines else []))


# --- timing ----------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_s(call: Callable[[], Any], device: torch.device, budget_s: float = 0.5) -> float:
    """Median wall time of call, repeated within about budget_s (3 to 50 times)."""
    call()
    _sync(device)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (len(times) < 50 and time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        call()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


GPU_SLEEP_CYCLES = 200_000  # the device waits longer than the host takes to launch the kernel


class _TimedLauncher:
    """A launcher that records its time per launch (CPU: wall time; CUDA: events)."""

    def __init__(self, launcher: Callable, device: torch.device):
        self.launcher, self.device, self.times = launcher, device, []
        aligned = getattr(launcher, "aligned", None)
        if aligned is not None:
            self.aligned = lambda *a: self._timed(aligned, a)

    def __call__(self, *args: Any) -> Any:
        return self._timed(self.launcher, args)

    def _timed(self, fn: Callable, args: tuple) -> Any:
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            out = fn(*args)
            self.times.append(time.perf_counter() - t0)
            return out
        # the device waits on a short sleep while the host queues the launch: the events then
        # time the kernel, not the host's launch gap
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)
        torch.cuda._sleep(GPU_SLEEP_CYCLES)
        start.record()
        out = fn(*args)
        end.record()
        end.synchronize()
        self.times.append(start.elapsed_time(end) / 1e3)
        return out

    def seconds(self) -> float | None:
        """The fastest launch: on a shared machine, the one least disturbed by other work
        (a kernel launched several times a call on other buffers has the same cost model)."""
        return min(self.times) if self.times else None


def _time_kernels(reports: list[CompileReport], run: Callable[[], Any], device: torch.device,
                  calls: int = 10) -> list[dict[str, float]]:
    """Per report, each kernel's measured time per launch (the fastest): its launchers, as the
    loaded host program names them, wrapped with timers for a few calls of run."""
    patched: list[tuple[dict, str, Any]] = []
    timers: list[dict[str, _TimedLauncher]] = []
    for r in reports:
        call = r.program() if r.program is not None else None
        scope = getattr(call, "__globals__", {})
        found = {}
        for k in r.kernels:
            if callable(scope.get(k.name)):
                found[k.name] = _TimedLauncher(scope[k.name], device)
                patched.append((scope, k.name, scope[k.name]))
                scope[k.name] = found[k.name]
        timers.append(found)
    try:
        run()  # warm
        for found in timers:
            for t in found.values():
                t.times.clear()
        for _ in range(calls):
            run()
    finally:
        for scope, name, launcher in patched:
            scope[name] = launcher
    return [{name: t.seconds() for name, t in found.items() if t.times} for found in timers]


# --- explain ---------------------------------------------------------------------------------


def _launch_counts(report: CompileReport) -> Counter:
    from kiln.ir.host import Launch

    body = report.host_program.body if report.host_program is not None else ()
    return Counter(i.kernel for i in body if isinstance(i, Launch))


def explained_graph(report: CompileReport, show_kernels: bool = True, show_source: bool = False
                    ) -> GraphExplanation:
    """A compile report as data, with its predicted costs (measured times are explain's)."""
    cost: GraphCost | None = report.cost
    launches = _launch_counts(report)
    first_launch = {}  # a kernel's cost at its first launch (which may write new memory)
    for c in cost.kernels if cost else ():
        first_launch.setdefault(c.name, c)
    kernels = [KernelCost(k, first_launch.get(k.name), launches.get(k.name, 1),
                          source=report.source_map.get(k.name)) for k in report.kernels]
    be = break_even(report.seconds, cost.eager_seconds, cost.seconds, False) if cost and cost.eager else None
    return GraphExplanation(report, kernels, cost, be, None, show_kernels, show_source)


def _device_of(args: tuple, kwargs: dict) -> torch.device:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def explain(fn: Callable, *args: Any, options: dict | None = None, show_kernels: bool = True,
            show_source: bool = False, measure: bool = False, **kwargs: Any) -> Explanation:
    """Compile fn with kiln (options: kiln.compile's), run it on args and kwargs (fn's own keyword
    inputs) and describe every graph it produced, with predicted costs; measure=True also times
    eager, the compiled call and each kernel. What was compiled before stays compiled."""
    import kiln
    from kiln.frontend.backend import REPORTS

    def run(*run_args: Any, **run_kwargs: Any) -> Any:
        return fn(*run_args, **run_kwargs)

    device = _device_of(args, kwargs)
    Ceilings.for_device(device)  # measured here if never before: compiles only read them
    try:
        compiled = kiln.compile(run, **(options or {}))
        with REPORTS.collect() as reports:
            _sync(device)
            t0 = time.perf_counter()
            compiled(*args, **kwargs)
            _sync(device)
            first_call_s = time.perf_counter() - t0
        result = Explanation([explained_graph(r, show_kernels, show_source) for r in reports])
        result.memory = _step_peak(reports)
        costs = [g.cost for g in result.graphs if g.cost is not None]
        result.ceilings = costs[0].ceilings if costs else None
        if measure and reports:
            _measure(result, reports, lambda: fn(*args, **kwargs), lambda: compiled(*args, **kwargs),
                     device, first_call_s)
        elif costs and all(c.eager for c in costs):
            predicted = sum(c.seconds for c in costs)
            result.compile_s = max(first_call_s - predicted, 0.0)
            result.break_even = break_even(result.compile_s, sum(c.eager_seconds for c in costs),
                                           predicted, measured=False)
    finally:  # run's code is compiled anew by each explain: keep Dynamo's cache of it empty
        torch._dynamo.eval_frame.remove_from_cache(run)
    return result


def _step_peak(reports: list[CompileReport]) -> Any:
    from kiln.passes.peak import step_peak

    try:
        return step_peak(reports)
    except Exception:  # noqa: BLE001 - an estimate missing is no reason to lose the explanation
        return None


def _measure(result: Explanation, reports: list[CompileReport], eager: Callable, compiled: Callable,
             device: torch.device, first_call_s: float) -> None:
    result.eager_s = _median_s(eager, device)
    result.compiled_s = _median_s(compiled, device)
    per_kernel = _time_kernels(reports, compiled, device)
    result.compile_s = max(first_call_s - result.compiled_s, 0.0)
    result.break_even = break_even(result.compile_s, result.eager_s, result.compiled_s, measured=True)
    for graph, times in zip(result.graphs, per_kernel):
        for k in graph.kernels:
            k.measured_s = times.get(k.name)
        if times:
            graph.measured_s = sum(k.measured_s * k.launches for k in graph.kernels if k.measured_s)


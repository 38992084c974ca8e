"""Readable accounts of what kiln did with a graph: passes, fusion decisions, fallbacks,
kernels. `kiln.explain(fn, *args)` compiles fn on args and returns the text."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import torch

from kiln.ir.kernel import kernel_str
from kiln.passes.pipeline import CompileReport


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


def report_text(report: CompileReport, show_kernels: bool = False, show_source: bool = False) -> str:
    lines = ["passes:"]
    for p in report.passes:
        lines.append(f"  {p.name:<15} {p.seconds * 1e3:8.1f} ms  {p.summary}")
    if report.partition is not None:
        lines.append(report.partition.text())
    lines.append(f"kernels: {report.num_kernels}")
    for k in report.kernels:
        lines.append(f"  {kernel_summary(k)}")
    verdicts = Counter(d.verdict for d in report.decisions)
    lines.append("decisions: " + ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items())))
    for d in report.decisions:
        lines.append(f"  {d.verdict:<7} {d.node}: {d.reason}")
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


def explain(fn: Callable, *args: Any, options: dict | None = None, show_kernels: bool = True,
            show_source: bool = False, **kwargs: Any) -> str:
    """Compile fn with kiln (options: kiln.compile's), run it on args and kwargs (fn's own keyword
    inputs) and describe every graph it produced. What was compiled before stays compiled."""
    import kiln
    from kiln.frontend.backend import REPORTS

    def run(*run_args: Any, **run_kwargs: Any) -> Any:
        return fn(*run_args, **run_kwargs)

    try:
        with REPORTS.collect() as reports:
            kiln.compile(run, **(options or {}))(*args, **kwargs)
    finally:  # run's code is compiled anew by each explain: keep Dynamo's cache of it empty
        torch._dynamo.eval_frame.remove_from_cache(run)
    if not reports:
        return "kiln compiled no graph (everything ran in eager or ATen; see the log)"
    parts = []
    for i, r in enumerate(reports):
        parts.append(f"== graph {i} ==\n" + report_text(r, show_kernels, show_source))
    return "\n\n".join(parts)

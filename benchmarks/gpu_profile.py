"""GPU time per kernel and kiln's account of each graph, for the benchmarks' --profile and --explain."""

from __future__ import annotations

import dataclasses
import os

import torch


def name_kernels_by_graph() -> None:
    """Kernel names unique in the process (g<graph>_kernel<n>), so a profile tells graphs apart."""
    from kiln.passes import pipeline

    name_by_content = getattr(pipeline._name_by_content, "original", pipeline._name_by_content)
    graph_numbers: dict[int, int] = {}

    def unique_names(kernels, sched):
        prefix = f"g{graph_numbers.setdefault(id(sched.graph), len(graph_numbers))}_"
        named = name_by_content(kernels, sched)
        return {k: dataclasses.replace(v, name=prefix + v.name) for k, v in named.items()}

    unique_names.original = name_by_content
    pipeline._name_by_content = unique_names


def print_profile(variant: str, step, top: int | None = 45) -> None:
    """GPU time per kernel name over two calls of step, largest first (top None: all)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        step()
        torch.cuda.synchronize()
    totals: dict[str, list] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = totals.setdefault(e.name[:90], [0.0, 0])
            t[0] += e.device_time / 2e3  # us over two calls -> ms per call
            t[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
    print(f"--- {variant}: {sum(t for t, _ in totals.values()):.2f} ms of kernels per call, "
          f"{sum(n for _, n in totals.values()) // 2} launches per call")
    for name, (ms, n) in ranked[:top]:
        print(f"{ms:8.3f} ms {n // 2:5d}x  {name}")


def write_explain(folder: str) -> None:
    """Each graph kiln compiled: passes, kernels, decisions, host program and kernel sources."""
    from kiln.frontend.backend import REPORTS
    from kiln.tools.explain import report_text

    os.makedirs(folder, exist_ok=True)
    for i, report in enumerate(REPORTS):
        with open(os.path.join(folder, f"graph{i}.txt"), "w") as f:
            f.write(report_text(report, show_kernels=True) + "\n\n" + report.host_source + "\n")
            for name, source in report.sources.items():
                f.write(f"\n# {name}\n{source}\n")

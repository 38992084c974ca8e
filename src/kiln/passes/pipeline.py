"""kiln's compiler, one ordered list of passes. Read this file first.

    attention   matmul + scale + causal mask + softmax + matmul -> one fused attention call
    align       on a GPU, a matmul with a leading dimension off 16 bytes -> padded operands,
                product sliced back (where the cost model says the copies pay)
    addmm       a launch-bound addmm -> mm + a bias add that fuses (where the backend asks)
    import      FX graph of ATen ops -> tensor graph (unlowered ops become ATen calls)
    simplify    DCE + CSE (by rebuilding), constant folding, algebraic identities
    split       long reductions with few outputs -> partial results + a small final reduction
    store       what must be a buffer: inputs, outputs, ATen results and arguments
    fuse        kernels: element-wise inlined, reductions fused into consumers, merges
    kernelize   kernel IR for each kernel (a reduction read off its row is stored instead);
                kernels with the same text share one name and one build
    in place    kernels store the updates of graph inputs (an optimizer's parameters) into them,
                and point-wise results into the memory of a buffer they read last
    matmul      an ATen matmul and the element-wise kernel reading its product -> one Triton
                matmul template with the kernel as its epilogue (where the cost model says so)
    group       independent point-wise kernels run as one launch, as a foreach op
    overlap     collectives issued as early as their inputs allow, waited for where needed
    host        the host program as data (ir/host.py): allocations, launches, ATen calls,
                the outputs in eager's layouts
    memory      temporaries into reused slots (a per-thread arena on the CPU), frees after
                last reads
    codegen     the backend's source for each kernel (C++ or Triton)
    build       compile kernels (cached on disk by content), load them; the host program's
                Python, generated with the launchers bound by kernel name

The backend (codegen/backends.py) is chosen by target and device; passes above codegen
only read its capabilities.

Every pass appends a PassRecord (what it did, how long it took) to the report that
`kiln explain` prints.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch.fx as fx

from kiln import logs
from kiln.codegen import host as host_codegen
from kiln.codegen.backends import Backend
from kiln.frontend.addmm import split_launch_bound_addmm
from kiln.frontend.attention import rewrite_attention
from kiln.frontend.importer import graph_device, import_graph
from kiln.frontend.matmul_alignment import align_matmuls
from kiln.ir.checks import ERROR_PARAM
from kiln.ir.kernel import Kernel, kernel_str, size_params
from kiln.ir.tensor import MATERIALIZED, Graph, Node, Op
from kiln.passes.foreach import group_kernels, walks_one_index
from kiln.passes.fusion import Decision, FusionMismatch, KernelPlan, Schedule, plan_stores, schedule
from kiln.passes.host_plan import build_host_program
from kiln.passes.in_place import write_in_place, write_over_dead_buffers
from kiln.passes.kernelize import emit_kernel, transposing_copy
from kiln.passes.layout import Layouts
from kiln.passes.matmul import use_templates
from kiln.passes.memory import plan_memory
from kiln.passes.overlap import overlap_communication
from kiln.passes.report import CompileReport, PassRecord
from kiln.passes.simplify import all_rules, simplify
from kiln.passes.source_map import (
    build_source_map,
    container_modules,
    kernel_name,
    kernel_nodes,
    node_origins,
)
from kiln.passes.split_reductions import split_reductions


@dataclass
class LaunchGraphs:
    """What each launch of a program computes, in tensor IR: the numerics check
    (tools/check.py) evaluates it from the launch's own buffers and compares."""

    graph: Graph
    buffer_names: dict[Node, str]
    roots: dict[tuple[str, tuple[str, ...]], list[Node]]  # (kernel, launch args) -> nodes it stores
    launchers: dict[str, Callable]
    backend: Backend


class _Timer:
    def __init__(self, report: CompileReport, name: str):
        self.report, self.name, self.summary = report, name, ""

    def __enter__(self):
        logs.step(self.name)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        record = PassRecord(self.name, time.perf_counter() - self.t0, self.summary)
        self.report.passes.append(record)
        logs.passes.info("%-15s %8.1f ms  %s", record.name, record.seconds * 1e3, record.summary)


def buffer_names_for(graph: Graph, stored) -> dict[Node, str]:
    names = {}
    for n in graph.nodes:
        if n in stored:
            names[n] = f"arg{n.attrs[0]}" if n.op is Op.INPUT else f"buf{n.id}"
    return names


def compile_graph(
    gm: fx.GraphModule, example_inputs: list[Any], backend: Backend, check: bool = False
) -> tuple[Callable, CompileReport]:
    """check: also keep what each launch computes (report.launches), for the numerics check."""
    with logs.Progress(f"compiling a graph of {len(gm.graph.nodes)} FX nodes"):
        call, report = _compile_graph(gm, example_inputs, backend, check)
    _log_compiled(report)
    return call, report


def _compile_graph(
    gm: fx.GraphModule, example_inputs: list[Any], backend: Backend, check: bool
) -> tuple[Callable, CompileReport]:
    report = CompileReport(backend=backend.name)
    with _Timer(report, "attention") as t:
        t.summary = f"{rewrite_attention(gm)} written-out attentions fused"
    with _Timer(report, "align") as t:
        aligned = align_matmuls(gm, _gpu_ceilings(example_inputs))
        t.summary = f"{aligned} matmuls on operands padded to 16-byte rows"
    if backend.split_small_addmm:
        with _Timer(report, "addmm") as t:
            t.summary = f"{split_launch_bound_addmm(gm)} launch-bound addmm split into mm + bias"
    with _Timer(report, "import") as t:
        graph, report.fallbacks = import_graph(gm, example_inputs, backend.unsupported_fns)
        t.summary = f"{len(graph.nodes)} nodes, {len(report.fallbacks)} op kinds run in ATen"
    logs.debug_text(logs.passes, "tensor graph after import", lambda: str(graph))
    with _Timer(report, "simplify") as t:
        before = len(graph.nodes)
        graph, fired = simplify(graph, all_rules(backend.row_scratch_limit))
        fired_text = ", ".join(f"{k} x{v}" for k, v in sorted(fired.items()))
        t.summary = f"{before} -> {len(graph.nodes)} nodes" + (f"; {fired_text}" if fired_text else "")
    logs.debug_text(logs.passes, "tensor graph after simplify", lambda: str(graph))
    with _Timer(report, "split") as t:
        graph, split = split_reductions(graph, backend.busy_programs, backend.column_block)
        t.summary = f"{split} reductions split across programs"
    logs.debug_text(logs.passes, "tensor graph after split", lambda: str(graph))
    report.graph_text = str(graph)
    layouts = Layouts(graph)
    with _Timer(report, "store") as t:
        stored, aliases, decisions = plan_stores(graph, layouts)
        t.summary = f"{len(stored)} buffers, {len(aliases)} views passed without copy"
    with _Timer(report, "fuse+kernelize") as t:
        sched, kernels = _fuse_and_kernelize(graph, stored, aliases, decisions, layouts, backend)
        names = buffer_names_for(graph, sched.stored)
        updates = write_in_place(sched, kernels, names, layouts)
        kernels = _name_by_content(kernels, sched)
        templates = _matmul_templates(sched, kernels, names, layouts, backend, example_inputs)
        # the numerics check evaluates each launch from its inputs after it ran: they stay intact
        reused = [] if check else write_over_dead_buffers(sched, kernels, names, layouts)
        left_in_aten = {str(s.attrs[0]) for s in sched.steps
                        if not isinstance(s, KernelPlan) and s.op is Op.EXTERN}
        for name in [n for n in report.fallbacks if n not in left_in_aten and templates]:
            if any(d.node.endswith(" " + name) for d in templates if d.verdict == "template"):
                del report.fallbacks[name]  # every call of it became a matmul template
        joins = _joins_group(example_inputs) if backend.group_flat_only else None
        groups = group_kernels(sched, kernels, backend.group_members, backend.group_buffers, joins)
        kernels = _name_by_content(kernels, sched)
        sched.decisions.extend(updates + reused + templates + groups)
        for step in sched.steps:
            copy = transposing_copy(kernels[id(step)], step, names, layouts) if id(step) in kernels else None
            if copy is not None:
                sched.decisions.append(copy)
        report.layouts = [layouts.choice(n) for n in graph.nodes
                          if n in sched.stored and n.op not in MATERIALIZED]
        report.decisions = sched.decisions
        report.kernels = list({k.name: k for k in kernels.values()}.values())  # distinct kernels
        report.source_map = build_source_map(sched.steps, sched.stored, kernels, names)
        report.node_origins = node_origins(graph)
        externs = sum(1 for s in sched.steps if not isinstance(s, KernelPlan) and s.op is Op.EXTERN)
        in_place = sum(d.verdict == "in place" for d in updates)
        fused = sum(d.verdict == "template" for d in templates)
        t.summary = (f"{len(kernels)} kernels, {externs} ATen calls; {len(groups)} kernel groups, "
                     f"{in_place} of {len(updates)} input updates in place, {len(reused)} results stored "
                     f"over dead buffers, {fused} matmul templates")
    with _Timer(report, "overlap") as t:
        moved = overlap_communication(sched, kernels, names)
        sched.decisions.extend(moved)
        t.summary = f"{len(moved)} collectives or waits moved to overlap computation"
    with _Timer(report, "host") as t:
        device = graph_device(example_inputs)
        host = build_host_program(sched, kernels, names, layouts, device, backend.pass_pointers)
        t.summary = f"{len(host.body)} instructions"
    with _Timer(report, "memory") as t:
        report.buffer_layouts = {name: (n.dtype, tuple(n.shape)) for n, name in names.items()}
        host, plan = plan_memory(host, layouts=report.buffer_layouts)
        report.host_program = host
        t.summary = plan.summary()
    with _Timer(report, "codegen") as t:
        rendered = [size_params(kern) for kern in report.kernels]  # sizes become parameters
        report.sources = {kern.name: backend.render(kern) for kern in rendered}
        if backend.size_choices is not None:  # what a shape family's kernels decided about sizes
            report.decisions += [Decision(kern.name, "sizes", backend.size_choices(kern))
                                 for kern in rendered if kern.sizes]
        t.summary = f"{sum(len(s) for s in report.sources.values())} bytes of {backend.language}"
    with _Timer(report, "build") as t:
        kern_list = rendered
        launchers, report.cache_hits = backend.build(kern_list, [report.sources[k.name] for k in kern_list])
        by_name = {kern.name: launch for kern, launch in zip(kern_list, launchers)}
        report.binaries = {name: fn.binaries() for name, fn in by_name.items() if hasattr(fn, "binaries")}
        call, report.host_source = host_codegen.load_with_source(host, by_name)
        report.program = weakref.ref(call)
        if check:
            report.launches = LaunchGraphs(graph, names, _launch_roots(sched, kernels), by_name, backend)
        t.summary = f"{len(launchers) - report.cache_hits} compiled, {report.cache_hits} from cache"
    return call, report


def _gpu_ceilings(example_inputs):
    """The device's measured ceilings when known (a compile does not time the device), else
    the nominal GPU's."""
    from kiln.passes.roofline import NOMINAL_GPU
    from kiln.runtime.ceilings import known_ceilings

    device = graph_device(example_inputs)
    return (known_ceilings(device) if device.type == "cuda" else None) or NOMINAL_GPU


def _cpu_ceilings():
    """The CPU's measured ceilings when known (a compile does not time the machine), else the
    nominal CPU's."""
    import torch

    from kiln.passes.roofline import NOMINAL_CPU
    from kiln.runtime.ceilings import known_ceilings

    return known_ceilings(torch.device("cpu")) or NOMINAL_CPU


def _joins_group(example_inputs) -> Callable[[Kernel], bool]:
    """Whether a kernel may join a GPU kernel group: when the cost model predicts its launch
    costs more than its work, or when all its streams walk one index (an optimizer step's
    update of a large weight), so that running its programs flat, after another member's,
    loses no tiling while the group saves each kernel's last partial wave."""
    from kiln.passes.cost import kernel_cost

    ceilings = _gpu_ceilings(example_inputs)

    def joins(kern: Kernel) -> bool:
        if walks_one_index(kern):
            return True
        try:
            return kernel_cost(kern, ceilings).bound == "launch"
        except Exception:  # noqa: BLE001 - an estimate must not fail the compile
            return False

    return joins


def _matmul_templates(sched, kernels, names, layouts, backend: Backend, example_inputs) -> list[Decision]:
    """passes/matmul.py where the backend has templates: forced, or by the cost model (C++ on
    a CPU, Triton on a GPU)."""
    from kiln.passes.matmul_choice import CPU_MATMUL, GPU_MATMUL

    if backend.matmul_templates is False:
        return []
    cpu = backend.name == "cpp"
    if backend.matmul_templates is None and not cpu and graph_device(example_inputs).type != "cuda":
        return []  # Triton's interpreter: only where forced
    ceilings = _cpu_ceilings() if cpu else _gpu_ceilings(example_inputs)
    forced = backend.matmul_templates is True
    timed, tile = backend.times_matmuls, backend.matmul_tile
    return use_templates(sched, kernels, names, layouts, forced, ceilings, timed, tile, backend.matmul_spills,
                         CPU_MATMUL if cpu else GPU_MATMUL)


def _launch_roots(sched: Schedule, kernels: dict[int, Kernel]) -> dict[tuple, list[Node]]:
    """Each launch's key in the host program (kernel name, buffers) -> the nodes it stores."""
    return {(kern.name, tuple(a for a in kern.args if a != ERROR_PARAM)): list(step.roots)
            for step in sched.steps if (kern := kernels.get(id(step))) is not None}


def _log_compiled(report: CompileReport) -> None:
    """What the later passes made, for the topics that show it at debug level."""
    from kiln.tools.explain import decision_lines

    externs = len([e for e in report.source_map.values() if e.kind == "aten"])
    verdicts = ", ".join(f"{v} {sum(d.verdict == v for d in report.decisions)}"
                         for v in sorted({d.verdict for d in report.decisions}))
    logs.fusion.info("%d kernels, %d ATen calls; decisions: %s", report.num_kernels, externs,
                     verdicts or "none")
    logs.debug_text(logs.fusion, "decisions", lambda: "\n".join(decision_lines(report.decisions,
                                                                               report.node_origins)))
    logs.debug_text(logs.passes, "kernel IR after kernelize",
                    lambda: "\n\n".join(kernel_str(k) for k in report.kernels))
    logs.debug_text(logs.passes, "host program after memory", lambda: str(report.host_program))
    logs.kernels.info("%d kernels: %s", report.num_kernels, ", ".join(k.name for k in report.kernels))
    for name, source in report.sources.items():
        logs.debug_text(logs.kernels, f"source of {name}", lambda source=source: source)
    logs.cache.info("kernels: %d compiled, %d from the kernel cache", report.num_kernels - report.cache_hits,
                    report.cache_hits)


def _fuse_and_kernelize(
    graph, stored, aliases, decisions, layouts, backend: Backend
) -> tuple[Schedule, dict[int, Kernel]]:
    unshared: set[Node] = set()  # stored reductions kernelize found read at other rows
    while True:
        sched = schedule(graph, dict(stored), aliases, list(decisions), backend.merge_unrelated_points,
                         _cpu_ceilings() if backend.store_broadcast_math else None,
                         backend.merge_unrelated_buffers, frozenset(unshared))
        names = buffer_names_for(graph, sched.stored)
        kernels: dict[int, Kernel] = {}
        try:
            for step in sched.steps:
                if isinstance(step, KernelPlan):
                    kernels[id(step)] = emit_kernel(
                        "kernel", step, names, layouts, backend.row_scratch_limit, backend.keep_loaded_rows
                    )
            return sched, _name_by_content(kernels, sched)
        except FusionMismatch as e:
            if e.node in sched.stored and e.node not in unshared:  # a kernel computed it for another
                unshared.add(e.node)
                continue
            if e.node in sched.stored:  # storing it again would change nothing
                raise RuntimeError(f"kernelize: {e.reason}") from e
            stored = dict(sched.stored)
            stored[e.node] = e.reason


def _name_by_content(kernels: dict[int, Kernel], sched: Schedule) -> dict[int, Kernel]:
    """kiln_<what it fuses>_0, _1, ... in order of first appearance; kernels with the same text
    (the same computation on other buffers) share a name and are built once."""
    names: dict[str, str] = {}
    plans, containers = {id(step): step for step in sched.steps}, container_modules(sched.graph)
    out = {}
    for key, kern in kernels.items():
        text = kernel_str(size_params(kern))  # the shape family's symbols as ks0, ...
        if text not in names:
            names[text] = kernel_name(kernel_nodes(plans[key].roots, sched.stored), len(names), containers)
        name = names[text]
        out[key] = dataclasses.replace(kern, name=name)
    return out

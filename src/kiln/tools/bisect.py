"""Bisection of a kernel over tolerance (tools/check.py): which fusion decision, or which op,
changes its result.

The kernel's tensor-IR sub-graph is compiled alone, as a graph of its own whose inputs are the
kernel's input buffers (their values from the checked call), and run against the sub-graph's
float64 evaluation. Decisions are forced to "no fuse" by storing the value a decision inlined
(a stored value is computed by a kernel of its own and loaded by its consumers); a merge is
undone by compiling each stored output alone. The search:

1. the sub-graph alone as compiled: if it is within tolerance, the kernel's inputs or layouts
   in the whole graph matter, not its own code;
2. a merged kernel: each output alone; where all are then within tolerance, the merge;
3. every inlined value stored: if still over tolerance, an op is wrong on its own; the checked
   run names the first kernel (one op) over tolerance;
4. else the shortest prefix of the inlined values (in graph order) whose storing brings the
   kernel within tolerance, found by halving: its last value is the decision; storing that one
   alone is tried too, to say whether it suffices.

Each step compiles the small sub-graph once (its kernels are cached by content).
"""

from __future__ import annotations

from typing import Callable

import torch

from kiln.codegen import host as host_codegen
from kiln.ir.evaluate import subgraph
from kiln.ir.tensor import Builder, Graph, Node, Op, node_str
from kiln.passes.fusion import plan_stores
from kiln.passes.host_plan import build_host_program
from kiln.passes.layout import Layouts
from kiln.passes.memory import plan_memory
from kiln.passes.pipeline import (
    CompileReport,
    LaunchGraphs,
    _fuse_and_kernelize,
    _launch_roots,
    buffer_names_for,
)

FORCED = "not fused: forced by the numerics bisection"
# Inlined ops that are no decision worth naming: constants and index ranges cost nothing to
# recompute and compute exactly.
_NOT_DECISIONS = (Op.CONSTANT, Op.IOTA)


def standalone(roots: list[Node], given: dict[Node, torch.Tensor]) -> tuple[Graph, list[torch.Tensor], dict]:
    """The sub-graph computing roots as a graph of its own: the given nodes become its inputs
    (with the given tensors' strides); returns it, its inputs and old node -> new node."""
    b = Builder()
    new: dict[Node, Node] = {}
    inputs = []
    for position, node in enumerate(sorted(given, key=lambda n: n.id)):
        tensor = given[node]
        new[node] = b.make(Op.INPUT, (), (position, tuple(tensor.stride())), node.shape, node.dtype)
        inputs.append(tensor)
    for node in subgraph(roots, set(given)):
        new[node] = b.make(node.op, tuple(new[i] for i in node.inputs), node.attrs, node.shape, node.dtype,
                           dict(node.meta))
    outs = [new[r] for r in roots]
    graph = b.finish(outs, len(inputs), [None] * len(outs), [True] * len(outs), [None] * len(outs))
    return graph, inputs, new


def compile_standalone(graph: Graph, device: torch.device, backend,
                       forced: set[Node]) -> tuple[Callable, CompileReport]:
    """The pipeline from the store pass on, with the forced nodes stored."""
    layouts = Layouts(graph)
    stored, aliases, decisions = plan_stores(graph, layouts)
    for n in forced:
        stored.setdefault(n, FORCED)
    sched, kernels = _fuse_and_kernelize(graph, stored, aliases, decisions, layouts, backend)
    names = buffer_names_for(graph, sched.stored)
    host, _ = plan_memory(build_host_program(sched, kernels, names, layouts, device, backend.pass_pointers))
    report = CompileReport(backend=backend.name, host_program=host)
    report.kernels = list({k.name: k for k in kernels.values()}.values())
    report.sources = {k.name: backend.render(k) for k in report.kernels}
    launchers, _ = backend.build(report.kernels, [report.sources[k.name] for k in report.kernels])
    by_name = {k.name: fn for k, fn in zip(report.kernels, launchers)}
    report.launches = LaunchGraphs(graph, names, _launch_roots(sched, kernels), by_name, backend)
    return host_codegen.load(host, by_name), report


class _Trial:
    """Compiles and runs the sub-graph with decisions forced; says whether it is over tolerance."""

    def __init__(self, roots: list[Node], given: dict[Node, torch.Tensor], backend):
        from kiln.tools.check import check_launch

        self.graph, self.inputs, self.new = standalone(roots, given)
        self.device = self.inputs[0].device if self.inputs else torch.device("cpu")
        self.backend = backend
        self.check_launch = check_launch
        self.runs = 0

    def over(self, forced: set[Node], outputs: list[int] | None = None) -> bool:
        graph = self.graph
        if outputs is not None:
            graph = Graph(graph.nodes, [graph.outputs[k] for k in outputs], graph.num_inputs,
                          [None] * len(outputs), [True] * len(outputs), [None] * len(outputs))
        call, _ = compile_standalone(graph, self.device, self.backend, {self.new[n] for n in forced})
        self.runs += 1
        results = call(list(self.inputs))
        inputs = {n: t for n, t in zip(_inputs(graph), self.inputs)}
        roots = list(graph.outputs)
        errors = self.check_launch(roots, inputs, dict(zip(roots, results)))
        return any(e.over for e in errors)

    def first_bad_kernel(self, forced: set[Node]):
        """The checked run of the sub-graph with the forced values stored: its first mismatch."""
        from kiln.tools.check import checked_call

        _, report = compile_standalone(self.graph, self.device, self.backend, {self.new[n] for n in forced})
        call, session = checked_call(report)
        call(list(self.inputs))
        self.runs += 1
        return session.result.mismatches[0] if session.result.mismatches else None


def _inputs(graph: Graph) -> list[Node]:
    return sorted((n for n in graph.nodes if n.op is Op.INPUT), key=lambda n: n.attrs[0])


def _label(n: Node) -> str:
    return node_str(n)


def bisect_mismatch(mismatch, launches: LaunchGraphs | None) -> str:
    """What changes the mismatching kernel's result: a fusion decision, a merge or an op."""
    if launches is None:
        return ""
    roots, given = list(mismatch.roots), dict(mismatch.given)
    return bisect(roots, given, launches.backend)


def bisect(roots: list[Node], given: dict[Node, torch.Tensor], backend) -> str:
    trial = _Trial(roots, given, backend)
    inlined = [n for n in subgraph(roots, set(given)) if n not in roots and n.op not in _NOT_DECISIONS]
    if not trial.over(set()):
        return ("compiled alone from the same inputs, the kernel is within tolerance: what differs is "
                "its place in the whole graph (its inputs' layouts, a buffer shared with another launch)")
    if len(roots) > 1:
        alone = [k for k in range(len(roots)) if trial.over(set(), [k])]
        if not alone:
            return (f"the merge of {', '.join(map(repr, roots))} into one kernel: each computed by a kernel "
                    f"of its own is within tolerance ({trial.runs} compiles)")
        roots = [roots[alone[0]]]
        trial = _Trial(roots, given, backend)
        inlined = [n for n in subgraph(roots, set(given)) if n not in roots and n.op not in _NOT_DECISIONS]
    if not inlined or trial.over(set(inlined)):
        bad = trial.first_bad_kernel(set(inlined))
        if bad is None:
            return (f"not a fusion decision, nor one op: with every inlined value stored each op is within "
                    f"tolerance, yet the chain's rounding errors add up past it ({trial.runs} compiles)")
        return (f"not a fusion decision: with every inlined value stored, an op is still over tolerance "
                f"on its own: {bad.ops.splitlines()[-2]} ({trial.runs} compiles)")
    lo, hi = 0, len(inlined)  # storing inlined[:hi] is within tolerance; inlined[:lo] is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if trial.over(set(inlined[:mid])):
            lo = mid
        else:
            hi = mid
    decision = inlined[hi - 1]
    alone = not trial.over({decision})
    suffix = "" if alone else f" (together with storing the {hi - 1} inlined values before it)"
    return (f"the fusion decision that inlined {_label(decision)} into the kernel: stored instead{suffix}, "
            f"the kernel is within tolerance ({trial.runs} compiles)")

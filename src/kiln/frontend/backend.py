"""The Dynamo backend: AOTAutograd with kiln's decompositions, then kiln's compiler on the
forward (and backward) ATen graphs. Whatever kiln cannot compile runs in ATen, with a
warning that says why; a user's program never fails inside kiln."""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

from kiln import errors
from kiln.codegen.backends import get_backend, resolve_target, target_problem
from kiln.frontend.decompositions import decomposition_table, eager_only_reason
from kiln.frontend.importer import graph_device
from kiln.frontend.partition import PartitionSummary, partition
from kiln.options import Options, env_debug

log = logging.getLogger("kiln")

# Reports of the graphs compiled in this process, newest last (read by `kiln explain`).
REPORTS: list = []


def _unsupported_reason(example_inputs: list[Any], target: str) -> str | None:
    devices = set()
    for x in example_inputs:
        if isinstance(x, torch.SymInt):  # kiln_backend compiles symbolic graphs per shape instead
            return "symbolic shapes reached the compiler"
        if isinstance(x, torch.Tensor):
            devices.add(x.device)
            problem = target_problem(target, x.device)
            if problem:
                return problem
            if any(isinstance(s, torch.SymInt) for s in x.shape):
                return "symbolic shapes reached the compiler"
            if x.is_complex() or x.is_sparse or x.is_quantized:
                return f"{x.dtype} / {x.layout} tensors are not compiled"
    if len(devices) > 1:
        return f"inputs on several devices ({', '.join(sorted(map(str, devices)))})"
    return None


def compile_aten_graph(gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                       partition_summary: PartitionSummary | None = None) -> Callable:
    """Compile one ATen graph; on any failure, return the graph itself (runs in ATen)."""
    device = graph_device(example_inputs)
    target = resolve_target(options.target, device)
    reason = _unsupported_reason(example_inputs, target)
    kind = "unsupported"
    if reason is None:
        try:
            from kiln.passes.pipeline import compile_graph

            fn, report = compile_graph(gm, example_inputs, get_backend(target, options))
            report.partition = partition_summary
            REPORTS.append(report)
            fn._boxed_call = True
            if options.mode == "reduce-overhead" and device.type == "cuda":
                from kiln.runtime.cudagraphs import CudaGraphRunner, static_input_indices

                return CudaGraphRunner(fn, static_input_indices())
            return fn
        except Exception as e:  # noqa: BLE001 - the user's program must still run
            if env_debug():
                raise
            kind, reason = "internal", f"{type(e).__name__}: {e}"
    errors.record(errors.Fallback("graph", kind, reason))
    return make_boxed_func(gm.forward)


def _untraced(fn: Callable) -> Callable:
    """A compiled backward, hidden from Dynamo. Dynamo runs a compiled forward untraced
    itself, but a backward runs from the autograd engine, possibly inside a compiled
    function (a training step that calls loss.backward()), where Dynamo would trace the
    host program and break its graph at every kernel call."""

    @torch.compiler.disable
    def run(args: list) -> Any:
        return fn(args)

    run._boxed_call = True
    return run


def _symbolic(example_inputs: list[Any]) -> bool:
    return any(isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and any(
        isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride()))) for x in example_inputs)


class _PerShape:
    """A graph Dynamo traced with symbolic shapes, compiled by kiln for each concrete shape it
    meets (kiln's kernels are specialized to their shapes). Dynamo keeps one graph and its
    guards; without it a caller would need dynamic=False, for which Dynamo patches its
    configuration around every call (7-24 us of host time per call on the H200's hosts). Past
    SHAPE_LIMIT shapes, as past Dynamo's recompile limit, new shapes run in ATen."""

    SHAPE_LIMIT = 16

    def __init__(self, gm: fx.GraphModule, options: Options):
        self.gm, self.options = gm, options
        self.compiled: dict[tuple, Callable] = {}

    @torch.compiler.disable  # compiling traces the graph: Dynamo must not trace that again
    def __call__(self, *args: Any) -> Any:
        key = tuple((a.shape, a.stride(), a.dtype, a.device, a.requires_grad) if isinstance(a, torch.Tensor)
                    else a for a in args)
        fn = self.compiled.get(key)
        if fn is None:
            if len(self.compiled) >= self.SHAPE_LIMIT:
                if len(self.compiled) == self.SHAPE_LIMIT:
                    log.warning("kiln: a graph met %d shapes; further shapes run in ATen", self.SHAPE_LIMIT)
                fn = self.compiled[key] = self.gm.forward
            else:
                fn = self.compiled[key] = kiln_backend(self.gm, list(args), self.options)
        return fn(*args)


def kiln_backend(gm: fx.GraphModule, example_inputs: list[Any], options: Options | None = None) -> Callable:
    """torch.compile(model, backend="kiln")."""
    options = options or Options()
    if _symbolic(example_inputs):
        return _PerShape(gm, options)
    eager_only = eager_only_reason(gm)
    if eager_only:
        errors.record(errors.Fallback("graph", "by design", eager_only))
        return gm.forward

    splits: list[PartitionSummary] = []  # one when AOTAutograd splits a training graph

    def fw_compiler(g: fx.GraphModule, inputs: list[Any]) -> Callable:
        return compile_aten_graph(g, inputs, options, splits[-1] if splits else None)

    @torch.compiler.disable  # compiled at the first backward, maybe inside a compiled function
    def bw_compiler(g: fx.GraphModule, inputs: list[Any]) -> Callable:
        return _untraced(compile_aten_graph(g, inputs, options))

    def partition_fn(joint, joint_inputs, **kwargs):
        splits.append(PartitionSummary())
        return partition(joint, joint_inputs, summary=splits[-1], **kwargs)

    try:
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                                     partition_fn=partition_fn, decompositions=decomposition_table())
    except (torch._dynamo.exc.RestartAnalysis, *torch._dynamo.exc.exceptions_allowed_to_be_fallback):
        raise  # Dynamo's own control flow: it re-traces the frame, or breaks the graph there
    except Exception as e:  # noqa: BLE001 - tracing failed (e.g. a decomposition): run the graph as is
        if env_debug():
            raise
        errors.record(errors.Fallback("graph", "trace", f"AOTAutograd failed: {type(e).__name__}: {e}"))
        return gm.forward

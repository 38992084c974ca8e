"""The Dynamo backend: AOTAutograd with kiln's decompositions, then kiln's compiler on the
forward (and backward) ATen graphs. Whatever kiln cannot compile runs in ATen, with a
warning that says why; a user's program never fails inside kiln."""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv

from kiln import counters, errors, logs
from kiln.codegen.backends import get_backend, resolve_target, target_problem
from kiln.frontend.attention_captured import rewrite_captured_attention
from kiln.frontend.decompositions import decomposition_table, eager_only_reason
from kiln.frontend.importer import cpu_scalars, graph_device
from kiln.frontend.linear_xent import rewrite_linear_cross_entropy
from kiln.frontend.padding import padding_plan
from kiln.frontend.padding_masks import masked_graph
from kiln.frontend.partition import PartitionSummary, partition
from kiln.frontend.random import draw_seeds_once, random_decompositions
from kiln.frontend.reports import REPORTS, ReportLog  # noqa: F401 - where callers find them
from kiln.ir import sizes
from kiln.ir.checks import RAISED_AS_EAGER
from kiln.lower.core import Unsupported
from kiln.options import Options, backend_options, env_debug, env_gpu_families, env_symbolic
from kiln.runtime.training_cache import aot_module_cached

log = logging.getLogger("kiln")
# kiln's compiles per shape: KILN_LOGS=recompiles, or with Dynamo's own under TORCH_LOGS=recompiles
recompiles_log = logs.recompiles


def _unsupported_reason(example_inputs: list[Any], target: str, family: bool = False) -> str | None:
    """Why kiln does not compile a graph with these inputs (None: it does). Symbolic sizes
    only reach the compiler in a shape family's compile (family=True)."""
    devices = set()
    for x in example_inputs:
        if isinstance(x, torch.SymInt) and not family:  # kiln_backend compiles these per shape
            return "symbolic shapes reached the compiler"
        if isinstance(x, torch.Tensor):
            devices.add(x.device)
            problem = target_problem(target, x.device)
            if problem:
                return problem
            if any(isinstance(s, torch.SymInt) for s in x.shape) and not family:
                return "symbolic shapes reached the compiler"
            if x.is_complex() or x.is_sparse or x.is_quantized:
                return f"{x.dtype} / {x.layout} tensors are not compiled"
    if len(devices) > 1:
        return f"inputs on several devices ({', '.join(sorted(map(str, devices)))})"
    return None


def compile_aten_graph(gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                       partition_summary: PartitionSummary | None = None,
                       captured_decisions: list | None = None) -> Callable:
    """Compile one ATen graph; on any failure, return the graph itself (runs in ATen).
    captured_decisions: what the rewrites of Dynamo's graph decided, for the report."""
    device = graph_device(example_inputs)
    target = resolve_target(options.target, device)
    reason = _unsupported_reason(example_inputs, target)
    kind = "unsupported"
    if reason is None:
        try:
            from kiln.passes import cost
            from kiln.runtime.graph_cache import compile_cached

            eager = cost.eager_before_passes(gm, device)  # the passes rewrite gm
            compile_fn = compile_cached
            if options.check:  # its first call checks every kernel's numerics
                from kiln.tools.check import compile_checked as compile_fn
            fn, report = compile_fn(gm, example_inputs, options, target, get_backend(target, options))
            report.partition, report.cost = partition_summary, cost.after_compile(report, eager)
            report.decisions = list(captured_decisions or ()) + report.decisions
            REPORTS.append(report)
            counters.graph_compiled(len(report.kernels), report.cache_hits, bool(report.from_cache))
            fn._boxed_call = True
            if options.mode == "reduce-overhead" and device.type == "cuda":
                from kiln.runtime.cudagraphs import CudaGraphRunner, static_input_indices

                fn = CudaGraphRunner(fn, static_input_indices())
            return _FirstCallChecked(fn, gm)
        except Unsupported as e:  # the graph as a whole is beyond kiln (the importer says why)
            reason = str(e)
        except Exception as e:  # noqa: BLE001 - the user's program must still run
            if env_debug():
                raise
            kind, reason = "internal", f"{type(e).__name__}: {e}"
    errors.record(errors.Fallback("graph", kind, reason))
    return make_boxed_func(gm.forward)


class FamilyFailed(Exception):
    """kiln cannot compile a graph for its whole shape family (the reason is the message):
    the graph compiles per shape instead."""


def by_buckets(options: Options, device: torch.device) -> bool:
    """Whether a family's program replays CUDA graphs by bucket (runtime/buckets.py)."""
    return options.mode == "reduce-overhead" and device.type == "cuda"


def compile_family_graph(gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                         partition_summary: PartitionSummary | None = None,
                         captured_decisions: list | None = None, backward: bool = False) -> Callable:
    """Compile one ATen graph with symbolic sizes once for its shape family, or raise
    FamilyFailed. Guards on sizes kiln's compile adds are counted (each specializes the
    family); a backward is compiled after Dynamo built its guards, so there one is a failure."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(example_inputs)
    env = getattr(mode, "shape_env", None)
    if env is None:
        raise FamilyFailed("the graph's sizes have no shape environment")
    device = graph_device(example_inputs)
    target = resolve_target(options.target, device)
    moved = cpu_scalars(example_inputs)  # compiled as the GPU's tensors, copied there per call
    try:
        example_inputs = [x.to(device) if i in moved else x for i, x in enumerate(example_inputs)]
    except Exception as e:  # noqa: BLE001 - the graph compiles per shape instead
        raise FamilyFailed(f"its CPU scalars cannot be taken to {device} ({type(e).__name__}: {e})") from e
    if device.type == "cuda" and not env_gpu_families():
        raise FamilyFailed("shape families on a GPU are off (KILN_GPU_FAMILIES=0)")
    if getattr(options, "check", False):  # the numerics check compares kernels at concrete sizes
        raise FamilyFailed("the numerics check compiles per shape")
    reason = _unsupported_reason(example_inputs, target, family=True)
    if reason is not None:
        raise FamilyFailed(reason)
    by_bucket = by_buckets(options, device)
    plan = padding_plan(gm, example_inputs) if by_bucket else None
    fallback = gm  # runs in ATen if the program fails: it takes the caller's inputs, as no masked graph does
    if plan is not None:
        try:
            gm, example_inputs = masked_graph(gm, plan, example_inputs)
        except Exception as e:  # noqa: BLE001 - each size gets a recording of its own instead
            plan.unpad(f"its masks could not be written ({type(e).__name__}: {e})")
    guards = len(env.guards)
    try:
        from kiln.passes import cost
        from kiln.runtime.graph_cache import compile_cached

        eager = cost.eager_before_passes(gm, device)  # the passes rewrite gm
        with sizes.family(env), errors.held() as records:  # told only if the family compiles
            fn, report = compile_cached(gm, example_inputs, options, target, get_backend(target, options))
    except Exception as e:  # noqa: BLE001 - whatever needs a number compiles per shape
        raise FamilyFailed(f"{type(e).__name__}: {e}") from e
    for r in records:
        errors.record(r)
    added = len(env.guards) - guards
    if added:
        counters.sizes_specialized(added)
        log.info("kiln: compiling a shape family added %d guards on its sizes", added)
        if backward:
            raise FamilyFailed("compiling the backward specialized a size")
    with sizes.family(env):  # costs at the traced sizes
        report.partition, report.cost = partition_summary, cost.after_compile(report, eager)
        pad = plan is not None and cost.launch_bound(report)
    report.decisions = list(captured_decisions or ()) + report.decisions
    REPORTS.append(report)
    counters.graph_compiled(len(report.kernels), report.cache_hits, bool(report.from_cache))
    counters.graph_symbolic()
    with sizes.family(env):
        report.family = family_text(report.host_program)
    recompiles_log.debug("kiln: one program for the shape family %s", report.family)
    fn._boxed_call = True
    if plan is not None:
        from kiln.runtime.buckets import BucketedGraphs, symbol_ranges
        from kiln.runtime.cudagraphs import static_input_indices

        ranges = symbol_ranges(env, plan.bound)
        fn = report.graphs = BucketedGraphs(fn, plan, ranges, pad, static_input_indices(),
                                            graphs=device.type == "cuda")
    if moved:  # before any recording: a graph must not record a copy from a host buffer
        fn = _ScalarsToDevice(fn, moved, device)
    return _FirstCallChecked(fn, fallback)


class _ScalarsToDevice:
    """A program compiled with its graph's CPU scalar tensors taken as the GPU's. Each call
    takes them there in one copy per dtype, from page-locked memory on CUDA: a copy from
    pageable memory waits for the work already queued, and one per scalar would stall the
    host at every call. Each scalar gets 16 bytes of its own, as kernels assume of buffers."""

    _boxed_call = True

    def __init__(self, fn: Callable, positions: list[int], device: torch.device):
        self.fn, self.positions, self.device = fn, positions, device
        self.pinned = device.type == "cuda"

    def __call__(self, args: list) -> Any:
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i in self.positions:
            by_dtype.setdefault(args[i].dtype, []).append(i)
        for dtype, positions in by_dtype.items():
            per_scalar = max(1, 16 // dtype.itemsize)
            host = torch.empty((len(positions), per_scalar), dtype=dtype, pin_memory=self.pinned)
            host[:, 0] = torch.stack([args[i] for i in positions])
            values = host.to(self.device, non_blocking=True)[:, 0].unbind(0)
            for i, value in zip(positions, values):
                args[i] = value
        return self.fn(args)


def family_text(program: Any) -> str:
    """Each size symbol of a program's family, where it is read and its traced value."""
    if program is None or not program.sizes:
        return "-"
    return ", ".join(f"{b.symbol} = args[{b.position}]" + (f".size({b.dim})" if b.dim is not None else "")
                     + f" (traced {sizes.hint(sizes.parse(b.symbol))})" for b in program.sizes)


class _FirstCallChecked:
    """A compiled program (boxed) whose first call, if kiln's code raises there (a kernel that
    does not load or launch), runs the graph in ATen instead, from then on, with one warning.
    An error the program raises as eager would (an index out of range) is the user's: it
    passes through, and the program stays compiled."""

    _boxed_call = True

    def __init__(self, fn: Callable, gm: fx.GraphModule):
        self.fn, self.gm, self.checked = fn, gm, False

    def __call__(self, args: list) -> Any:
        if self.checked:
            return self.fn(args)
        kept = list(args)  # a boxed program may clear the list it is given
        # kernels may have updated inputs in place before the failure: the rerun in ATen
        # must start from their values before the call
        updated = {i: kept[i].clone() for i in _updated_inputs(self.gm) if isinstance(kept[i], torch.Tensor)}
        try:
            out = self.fn(args)
        except Exception as e:  # noqa: BLE001 - the user's program must still run
            if env_debug() or getattr(e, RAISED_AS_EAGER, False):
                raise
            reason = f"the compiled program failed at its first call: {type(e).__name__}: {e}"
            errors.record(errors.Fallback("graph", getattr(e, "fallback_kind", "internal"), reason))
            for i, before in updated.items():
                kept[i].copy_(before)
            self.fn = make_boxed_func(self.gm.forward)
            out = self.fn(kept)
        self.checked = True
        return out


def _updated_inputs(gm: fx.GraphModule) -> list[int]:
    """The positions of the inputs the graph updates (AOTAutograd's copy_ into them)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    targets = {n.args[0] for n in gm.graph.nodes
               if n.op == "call_function" and n.target is torch.ops.aten.copy_.default}
    return [i for i, n in enumerate(placeholders) if n in targets]


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
    configuration around every call, at a cost in host time. Past SHAPE_LIMIT shapes, as
    past Dynamo's recompile limit, new shapes run in ATen."""

    SHAPE_LIMIT = 16
    _made = 0  # symbolic graphs met in this process: each is numbered in kiln.stats()

    def __init__(self, gm: fx.GraphModule, options: Options):
        self.gm, self.options = gm, options
        self.compiled: dict[tuple, Callable] = {}
        self.number = _PerShape._made
        _PerShape._made += 1

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
                variants = counters.shape_variant(self.number)
                shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
                recompiles_log.info("kiln: symbolic graph %d compiled for shapes %s (program %d of at most "
                                     "%d)", self.number, shapes, variants, self.SHAPE_LIMIT)
                fn = self.compiled[key] = _or_aten(self.gm, _compile_shape, self.gm, args, self.options)
        return fn(*args)


def _compile_shape(gm: fx.GraphModule, args: tuple, options: Options) -> Callable:
    """kiln's program for the concrete shape of args. A graph that reads numbers from 0-d
    tensors (.item()) traces them as symbols, so that one program serves every value; where an
    op needs the value itself while tracing, one program per value."""
    if not _reads_scalars(gm):
        return kiln_backend(gm, list(args), options)
    specialized, kept = _with_ints_inlined(gm, args)
    device, numbers = _numbers_to_move(gm, args)

    def inputs(call_args: tuple) -> list:
        return [call_args[i].to(device, non_blocking=True) if i in numbers else call_args[i] for i in kept]

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)  # it logs the failure that the except clause expects
    try:
        fn = _trace_and_compile(specialized, _trace_inputs(inputs(args)), options)
    except Exception as e:
        if not _needs_values(e):
            raise
        return _PerValue(gm, options)
    finally:
        fake_log.setLevel(level)
    return lambda *call_args: fn(*inputs(call_args))


def _needs_values(e: BaseException) -> bool:
    """Whether tracing failed because an op needs a number's value. An op whose schema
    PyTorch's dispatcher matches in C++ (e.g. _batch_norm_with_update) re-raises the Python
    error of its decomposition as a RuntimeError that keeps only its text."""
    while e is not None:
        wrapped = "error details: GuardOnDataDependentSymNode" in str(e)
        if isinstance(e, GuardOnDataDependentSymNode) or wrapped:
            return True
        e = e.__cause__ or e.__context__
    return False


def _numbers_to_move(gm: fx.GraphModule, args: tuple) -> tuple[torch.device | None, frozenset[int]]:
    """Dynamo passes numbers as 0-d CPU tensors; where the graph's other tensors are on an
    accelerator, kiln's kernels read the numbers there: the device and the positions of the
    tensors to move to it (those the graph only reads numbers from)."""
    devices = {a.device for a in args if isinstance(a, torch.Tensor) and a.dim() > 0}
    if len(devices) != 1 or next(iter(devices)).type == "cpu":
        return None, frozenset()
    placeholders = _placeholders(gm)
    return next(iter(devices)), frozenset(
        i
        for i, (n, a) in enumerate(zip(placeholders, args))
        if isinstance(a, torch.Tensor)
        and a.dim() == 0
        and a.device.type == "cpu"
        and n.users
        and all(u.op == "call_method" and u.target == "item" for u in n.users)
    )


def _reads_scalars(gm: fx.GraphModule) -> bool:
    return any(n.op == "call_method" and n.target == "item" for n in gm.graph.nodes)


def _with_ints_inlined(gm: fx.GraphModule, args: tuple) -> tuple[fx.GraphModule, list[int]]:
    """gm with its integer inputs (sizes, mostly) replaced by their values in args, and the
    positions of the inputs it still takes: a ShapeEnv would make those integers symbols."""
    return _inlined(gm, {n: a for n, a in zip(_placeholders(gm), args) if isinstance(a, int)})


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _inlined(gm: fx.GraphModule, values: dict[fx.Node, Any]) -> tuple[fx.GraphModule, list[int]]:
    """A copy of gm whose given nodes are replaced by constant values and which no longer takes
    the inputs it then does not read, and the positions of the inputs it still takes."""
    graph = fx.Graph()
    copies = dict(values)  # graph_copy adds each node it copies, with its copy
    graph.output(graph.graph_copy(gm.graph, copies))
    kept = []
    for position, node in enumerate(_placeholders(gm)):
        copy = copies[node]
        if isinstance(copy, fx.Node) and copy.users:
            kept.append(position)
        elif isinstance(copy, fx.Node):
            graph.erase_node(copy)
    return fx.GraphModule(gm, graph), kept


def _trace_inputs(args: list) -> list[Any]:
    """Fake tensors of the static shapes of args, in a fake mode with a ShapeEnv: with symbolic
    floats Dynamo passes a float as a 0-d tensor and reads it with .item(), which traces only
    there (to a symbol, which kiln's kernels load from the tensor)."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    mode.allow_scalar_outputs = True
    return [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]


class _PerValue:
    """A graph whose numbers read from its inputs (.item()) some op needs while tracing: compiled
    for each tuple of values it meets, with the values inlined; past VALUE_LIMIT, in ATen."""

    VALUE_LIMIT = 16

    def __init__(self, gm: fx.GraphModule, options: Options):
        self.gm, self.options = gm, options
        self.reads = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "item"]
        placeholders = _placeholders(gm)
        self.positions = [
            placeholders.index(n.args[0]) if n.args[0] in placeholders else -1 for n in self.reads
        ]
        self.compiled: dict[tuple, Callable] = {}

    def __call__(self, *args: Any) -> Any:
        if -1 in self.positions:  # a number read from a tensor the graph computes
            return self.gm.forward(*args)
        values = tuple(args[p].item() for p in self.positions)
        if values not in self.compiled:
            if len(self.compiled) >= self.VALUE_LIMIT:
                return self.gm.forward(*args)
            gm, kept = _inlined(self.gm, dict(zip(self.reads, values)))  # the numbers' tensors go
            fn = _or_aten(self.gm, kiln_backend, gm, [args[i] for i in kept], self.options)
            self.compiled[values] = fn, kept
        fn, kept = self.compiled[values]
        return fn(*[args[i] for i in kept])


def _or_aten(gm: fx.GraphModule, compile_fn: Callable[..., Callable], *args: Any) -> Callable:
    """compile_fn(*args), or, where kiln raises, gm itself (in ATen) with one warning."""
    try:
        return compile_fn(*args)
    except Exception as e:  # noqa: BLE001 - the user's program must still run
        return _in_aten(gm, e)


def _in_aten(gm: fx.GraphModule, error: Exception) -> Callable:
    """gm itself, run in ATen because kiln raised error (which KILN_DEBUG=1 raises instead)."""
    if env_debug():
        raise error
    errors.record(errors.Fallback("graph", "internal", f"{type(error).__name__}: {error}"))
    return gm.forward


def kiln_backend(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    options: Options | dict | None = None,
    mode: str | None = None,
) -> Callable:
    """torch.compile(model, backend="kiln"), whose mode= and options= (a dict) arrive here."""
    if not isinstance(options, Options):
        options = backend_options(mode, options)  # the user's arguments: an error raises
    elif mode is not None:
        raise TypeError("kiln_backend takes mode= only with options as a dict")
    try:
        eager_only = eager_only_reason(gm)
    except Exception as e:  # noqa: BLE001 - the user's program must still run
        return _in_aten(gm, e)
    if eager_only:
        errors.record(errors.Fallback("graph", "by design", eager_only))
        return gm.forward
    if _symbolic(example_inputs):
        return _compile_symbolic(gm, example_inputs, options)
    try:
        return _trace_and_compile(gm, example_inputs, options)
    except (torch._dynamo.exc.RestartAnalysis, *torch._dynamo.exc.exceptions_allowed_to_be_fallback):
        raise  # Dynamo's own control flow: it re-traces the frame, or breaks the graph there
    except Exception as e:  # noqa: BLE001 - tracing failed (e.g. a decomposition): run the graph as is
        if env_debug():
            raise
        errors.record(errors.Fallback("graph", "trace", f"AOTAutograd failed: {type(e).__name__}: {e}"))
        return gm.forward


def _compile_symbolic(gm: fx.GraphModule, example_inputs: list[Any], options: Options) -> Callable:
    """A graph Dynamo traced with symbolic shapes: one program for its shape family, or, where
    kiln needs a number for it (or KILN_SYMBOLIC=0), a program per shape, said once."""
    reason = "KILN_SYMBOLIC=0"
    if env_symbolic():
        try:
            return _trace_and_compile(gm, example_inputs, options, family=True)
        except (torch._dynamo.exc.RestartAnalysis, *torch._dynamo.exc.exceptions_allowed_to_be_fallback):
            raise
        except Exception as e:  # noqa: BLE001 - the family's compile failed: per shape instead
            reason = _family_reason(e)
    counters.compiled_per_shape(reason)
    # beside each later shape's compile, under recompiles (a child of kiln's logger: once)
    recompiles_log.info("kiln: a graph with symbolic shapes compiles per shape: %s", reason)
    return _PerShape(gm, options)


def _family_reason(e: BaseException) -> str:
    """The FamilyFailed reason under whatever AOTAutograd wrapped it in."""
    seen = e
    while seen is not None:
        if isinstance(seen, FamilyFailed):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return f"{type(e).__name__}: {e}"


class _BackwardPerShape:
    """A family's backward that kiln could not compile for the family: per shape (boxed)."""

    _boxed_call = True

    def __init__(self, gm: fx.GraphModule, options: Options):
        self.per_shape = _PerShape(gm, options)

    def __call__(self, args: list) -> Any:
        values = list(args)
        args.clear()
        return self.per_shape(*values)


def _trace_and_compile(gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                       family: bool = False) -> Callable:
    """AOTAutograd with kiln's decompositions, kiln on the forward and backward graphs
    (family: graphs with symbolic sizes, compiled once for their shape family)."""
    splits: list[PartitionSummary] = []  # one when AOTAutograd splits a training graph
    # rewrites of Dynamo's graph, before tracing: their backward is part of what they choose
    captured = rewrite_captured_attention(gm) + rewrite_linear_cross_entropy(gm)

    def fw_compiler(g: fx.GraphModule, inputs: list[Any]) -> Callable:
        draw_seeds_once(g)
        if family:
            return compile_family_graph(g, inputs, options, splits[-1] if splits else None, captured)
        return compile_aten_graph(g, inputs, options, splits[-1] if splits else None, captured)

    @torch.compiler.disable  # compiled at the first backward, maybe inside a compiled function
    def bw_compiler(g: fx.GraphModule, inputs: list[Any]) -> Callable:
        if family:
            try:
                return _untraced(compile_family_graph(g, inputs, options, backward=True))
            except FamilyFailed as e:
                counters.compiled_per_shape(f"backward: {e}")
                log.info("kiln: a backward with symbolic shapes compiles per shape: %s", e)
                return _untraced(_BackwardPerShape(g, options))
        return _untraced(compile_aten_graph(g, inputs, options))

    def partition_fn(joint, joint_inputs, **kwargs):
        splits.append(PartitionSummary())
        return partition(joint, joint_inputs, summary=splits[-1], **kwargs)

    # Dynamo's DDPOptimizer counts AOTAutograd calls to pair each bucket's forward with its
    # lazily compiled backward; its own aot_autograd backends count them here too
    torch._dynamo.utils.counters["aot_autograd"]["total"] += 1
    return aot_module_cached(  # AOTAutograd, or on a warm start what it made before
        gm,
        example_inputs,
        options,
        fw_compiler=fw_compiler,
        bw_compiler=bw_compiler,
        partition_fn=partition_fn,
        captured_decisions=captured,
        decompositions=decomposition_table() if options.eager_random
        else {**decomposition_table(), **random_decompositions()},
        # an inference graph's updates of its inputs (an optimizer step) stay in the graph, as
        # copy_ calls that kernels then write in place; a CUDA graph replays its recording on
        # copies of the inputs, so there AOTAutograd's wrapper copies the updates back instead
        keep_inference_input_mutations=options.mode != "reduce-overhead",
    )

"""The joint cache: what AOTAutograd made of one Dynamo graph, so that a warm process runs
neither AOTAutograd's tracing nor its partitioner.

An entry is keyed on Dynamo's graph the way a whole-graph entry is (graph_cache.graph_key:
its canonical text, the inputs' metadata with requires_grad, kiln's options and source, the
tool versions, the device), plus the grad and autocast modes. It holds no program itself:
it names the whole-graph entries of the forward (or inference) program and of the backward
program, and the calling convention between them, as AOTAutograd's partitioner left it:
which forward outputs are the user's and which are saved for the backward, which inputs
require grad, which outputs get a tangent, and where each backward input comes from.

On a hit, the programs are loaded from their entries and run by a small autograd.Function
(forward: the forward program, saving what the backward reads; backward: the backward
program). Only graphs whose convention is plain are cached: no input mutation, no output
that aliases an input or another output, no RNG state, no tensor subclass, no effect tokens,
static shapes, tensors only. Every other graph takes AOTAutograd's path, and why is logged
(KILN_LOGS=cache) and journaled as the miss `kiln cache why` shows.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from kiln import errors, logs
from kiln.ir.checks import RAISED_AS_EAGER
from kiln.options import env_debug, env_graph_cache
from kiln.runtime import cache, graph_cache

KIND = "joint"
FOLDER = "joint"
STEM = "joint"
CONVENTION = "convention.json"
# What the joint cache did in this process: "hit", "miss", "not cached: <why>".
STATS: Counter = Counter()
log = logs.cache


class NotPlain(Exception):
    """A graph whose calling convention the joint cache does not reproduce (the reason)."""


class _ProgramGone(Exception):
    """A program the entry names is missing or bad in the whole-graph cache."""


@dataclass(frozen=True)
class Convention:
    """How to run a Dynamo graph from its compiled programs, without AOTAutograd."""

    forward: str  # folder of the forward (or inference) program's whole-graph entry
    backward: str | None  # folder of the backward program's entry; None for an inference graph
    num_inputs: int
    inputs_requiring_grad: tuple[int, ...]
    num_user_outputs: int  # the forward program's first outputs; the rest are saved
    tangent_outputs: tuple[int, ...]  # the user outputs that get a tangent, in tangent order
    backward_inputs: tuple[tuple[str, int], ...]  # ("saved", k) or ("tangent", k), in order
    # user outputs that view an intermediate no other output shares: returned through
    # aten._unsafe_view, as AOTAutograd does, so that autograd sees no view to track
    unsafe_view_outputs: tuple[int, ...] = ()


# ---- the key ------------------------------------------------------------------------------


def _modes(device: torch.device) -> dict[str, str]:
    """The modes AOTAutograd traces under: grad mode picks an inference or a training graph."""
    parts = {"grad enabled": str(torch.is_grad_enabled())}
    if hasattr(torch, "get_autocast_dtype"):
        kind = device.type
        parts["autocast"] = str((torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)))
    return parts


def _entry(gm: fx.GraphModule, example_inputs: list[Any], options, target: str,
           device: torch.device) -> tuple[cache.Entry, str]:
    with unset_fake_temporarily():
        key = graph_cache.graph_key(gm, example_inputs, options, target, device)
    components = cache.key_components(**key.components, **_modes(device))
    return cache.entry(KIND, FOLDER, STEM, "", components), key.text


def _plain_graph_reason(gm: fx.GraphModule, example_inputs: list[Any], options) -> str | None:
    if options.mode == "reduce-overhead":
        return "mode reduce-overhead wraps the programs in CUDA graphs"
    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None:
        return "the graph holds parameters or buffers of its own"
    for node in gm.graph.nodes:
        if node.op == "call_function" and not _library_call(node.target):
            return f"the graph calls {node.target!r}, whose code its name does not pin down"
    for k, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            return f"input {k} is a {type(x).__name__}, not a tensor"
        plain = type(x) in (torch.Tensor, torch.nn.Parameter) or isinstance(x, torch._subclasses.FakeTensor)
        if not plain:
            return f"input {k} is a tensor subclass"
        if any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride())):
            return f"input {k} has symbolic sizes"
    return None


# Python functions a Dynamo graph may call that come with torch or Python, so that their name
# stands for their code; a user's function (allow_in_graph) may change under the same name.
_LIBRARIES = ("torch", "operator", "_operator", "math", "builtins", "kiln")


def _library_call(target: Any) -> bool:
    ops = torch._ops
    if isinstance(target, (ops.OpOverload, ops.OpOverloadPacket, ops.HigherOrderOperator)):
        return True
    try:
        name = fx.node._get_qualified_name(target)
    except Exception:  # noqa: BLE001 - no name: not a library function
        return False
    return name.split(".")[0] in _LIBRARIES


# ---- the convention, from what AOTAutograd gives kiln's compilers ---------------------------


def _plain_metadata_reason(meta: Any) -> str | None:
    """Why AOTAutograd's view-and-mutation metadata needs its own runtime wrappers, or None."""
    if meta is None:
        return "AOTAutograd left no metadata to read the convention from"
    if any(i.mutates_data or i.mutates_metadata or getattr(i, "mutation_inductor_storage_resize", False)
           for i in meta.input_info):
        return "the graph mutates an input (e.g. a running statistic)"
    if any(o.output_type.name not in ("non_alias", "unsafe_view_alias") for o in meta.output_info):
        return "an output aliases an input, another output or an intermediate"
    if any(not issubclass(o.raw_type, torch.Tensor) for o in meta.output_info):
        return "an output is not a tensor"
    if meta.num_intermediate_bases:
        return "an output aliases an intermediate"
    if getattr(meta, "is_rng_op_functionalized", False) or getattr(meta, "num_graphsafe_rng_states", 0):
        return "the graph carries RNG state"
    if getattr(meta, "tokens", None) or getattr(meta, "num_backward_tokens", 0):
        return "the graph has side-effect tokens"
    if getattr(meta, "num_symints_saved_for_bw", 0) or getattr(meta, "num_opaque_objects_saved_for_bw", 0):
        return "the forward saves sizes or opaque objects for the backward"
    if getattr(meta, "indices_of_inputs_that_requires_grad_with_mutations_in_bw", None):
        return "the backward mutates an input"
    for name in ("subclass_inp_meta", "subclass_fw_graph_out_meta", "subclass_tangent_meta"):
        metas = getattr(meta, name, None) or ()
        if any(not isinstance(m, int) and type(m).__name__ != "PlainTensorMeta" for m in metas):
            return "a tensor subclass crosses the graph"
    return None


def _current_metadata() -> Any:
    context = torch._guards.TracingContext.try_get()
    return getattr(context, "fw_metadata", None)


def _placeholders(g: fx.GraphModule) -> list[fx.Node]:
    return list(g.graph.find_nodes(op="placeholder"))


def _outputs(g: fx.GraphModule) -> list[Any]:
    return list(g.graph.find_nodes(op="output")[0].args[0])


@dataclass
class _Split:
    """What kiln saw of one AOTAutograd call while compiling it (names are the partitioner's,
    which the forward's outputs and the backward's inputs share)."""

    num_user_outputs: int = -1  # -1: no partition (an inference graph)
    saved: tuple[str, ...] = ()
    backward_placeholders: tuple[str, ...] = ()
    tangent_layouts_plain: bool = True
    backward_outputs: tuple[bool, ...] = ()  # whether each backward output is a tensor
    num_forward_inputs: int = -1
    meta: Any = None
    forward_entry: str | None = None


def _tangent_number(name: str) -> int | None:
    if not name.startswith("tangents_"):
        return None
    tail = name[len("tangents_"):]
    return int(tail) if tail.isdigit() else None


def convention_of(split: _Split, num_inputs: int, backward_entry: str | None) -> Convention:
    """The convention of a compiled call, or NotPlain with the reason."""
    reason = _plain_metadata_reason(split.meta)
    if reason:
        raise NotPlain(reason)
    meta = split.meta
    if split.forward_entry is None:
        raise NotPlain("kiln did not compile the forward graph into a whole-graph entry")
    if split.num_forward_inputs != num_inputs:
        raise NotPlain("the forward program takes other inputs than Dynamo's graph")
    requiring = tuple(k for k, i in enumerate(meta.input_info) if i.requires_grad)
    tangent_outputs = tuple(k for k, o in enumerate(meta.output_info) if o.requires_grad)
    unsafe_views = tuple(k for k, o in enumerate(meta.output_info)
                         if o.output_type.name == "unsafe_view_alias")
    if split.num_user_outputs < 0:  # inference: the program's outputs are the user's
        return Convention(split.forward_entry, None, num_inputs, requiring, len(meta.output_info), (), (),
                          unsafe_views)
    if backward_entry is None:
        raise NotPlain("kiln did not compile the backward graph into a whole-graph entry")
    if split.num_user_outputs != len(meta.output_info):
        raise NotPlain("the forward returns more than the user's outputs and saved values")
    if not split.tangent_layouts_plain:
        raise NotPlain("a tangent is traced with a non-contiguous layout")
    if len(split.backward_outputs) != num_inputs or any(
            split.backward_outputs[k] != (k in requiring) for k in range(num_inputs)):
        raise NotPlain("the backward's outputs do not match the inputs requiring grad")
    sources = []
    for name in split.backward_placeholders:
        number = _tangent_number(name)
        if number is not None and 1 <= number <= len(tangent_outputs):
            sources.append(("tangent", number - 1))
        elif name in split.saved:
            sources.append(("saved", split.saved.index(name)))
        else:
            raise NotPlain(f"the backward reads {name}, which the forward does not save")
    return Convention(split.forward_entry, backward_entry, num_inputs, requiring, split.num_user_outputs,
                      tangent_outputs, tuple(sources), unsafe_views)


# ---- the runtime --------------------------------------------------------------------------


def _user_outputs(c: Convention, outs: Any) -> tuple[torch.Tensor, ...]:
    if not c.unsafe_view_outputs:
        return tuple(outs)
    return tuple(torch.ops.aten._unsafe_view(o, o.shape) if k in c.unsafe_view_outputs else o
                 for k, o in enumerate(outs))


class _Step(torch.autograd.Function):
    """One training call: the forward program, then, from the autograd engine, the backward."""

    @staticmethod
    def forward(ctx, runner: "_Runner", *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c = runner.convention
        outs = runner.forward_program(list(args))
        user, saved = _user_outputs(c, outs[:c.num_user_outputs]), outs[c.num_user_outputs:]
        ctx.runner = runner
        ctx.save_for_backward(*saved)
        tangent = set(c.tangent_outputs)
        ctx.mark_non_differentiable(*(o for k, o in enumerate(user) if k not in tangent))
        return user

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        runner = ctx.runner
        c = runner.convention
        saved = ctx.saved_tensors
        tangents = [grads[k].contiguous() for k in c.tangent_outputs]
        args = [saved[k] if where == "saved" else tangents[k] for where, k in c.backward_inputs]
        del saved, tangents
        grads_in = runner.run_backward(args)
        requiring = set(c.inputs_requiring_grad)
        return (None, *(g if k in requiring else None for k, g in enumerate(grads_in)))


class _Runner:
    """The callable Dynamo gets on a hit: a Dynamo graph's programs and their convention. If
    the first call raises in kiln's code, Dynamo's graph runs in ATen from then on (autograd
    differentiates it as eager would), with one warning, as backend._FirstCallChecked does."""

    def __init__(self, convention: Convention, forward_program: Callable, backward_program: Callable | None,
                 gm: fx.GraphModule):
        self.convention = convention
        self.forward_program, self.backward_program = forward_program, backward_program
        self.gm, self.checked = gm, False

    @torch.compiler.disable  # the backward may run inside a compiled function (see backend._untraced)
    def run_backward(self, args: list) -> Any:
        return self.backward_program(args)

    def run(self, args: tuple) -> list:
        c = self.convention
        if c.backward is None:
            return list(_user_outputs(c, self.forward_program(list(args))))
        if not torch.is_grad_enabled():  # Dynamo guards grad mode: a program traced with it on
            return list(_user_outputs(c, self.forward_program(list(args))[:c.num_user_outputs]))
        return list(_Step.apply(self, *args))

    def __call__(self, *args: Any) -> list:
        if self.checked:
            return self.run(args)
        try:
            out = self.run(args)
        except Exception as e:  # noqa: BLE001 - the user's program must still run
            if env_debug() or getattr(e, RAISED_AS_EAGER, False):
                raise
            reason = f"the cached program failed at its first call: {type(e).__name__}: {e}"
            errors.record(errors.Fallback("graph", getattr(e, "fallback_kind", "internal"), reason))
            self.run = lambda call_args: list(self.gm.forward(*call_args))
            out = self.run(args)
        self.checked = True
        return out


# ---- lookup and store ---------------------------------------------------------------------


def load_runner(e: cache.Entry, gm: Any, options, target: str, t0: float,
                captured_decisions: list = ()) -> _Runner:
    """The runner of a joint entry's programs; gm (anything with Dynamo's graph's forward)
    runs in ATen if they fail at their first call."""
    from kiln import counters
    from kiln.codegen.backends import get_backend
    from kiln.frontend.reports import REPORTS

    convention = Convention(**{k: (tuple(tuple(x) if isinstance(x, list) else x for x in v)
                                   if isinstance(v, list) else v)
                               for k, v in json.loads((e.path / CONVENTION).read_text()).items()})
    compiler = get_backend(target, options)
    programs = []
    for name in (convention.forward, convention.backward):
        if name is None:
            programs.append(None)
            continue
        folder = cache.cache_dir(graph_cache.FOLDER) / name
        graph_entry = cache.Entry(graph_cache.KIND, name.rsplit("_", 1)[-1], folder,
                                  (cache.read_record(folder) or {}).get("components", {}))
        problem = cache.check(graph_entry)
        if problem is not None:
            raise _ProgramGone(f"its program {name} is {problem}")
        fn, report = graph_cache._load(folder, compiler, t0)
        graph_cache.STATS["hit"] += 1  # the programs are the whole-graph cache's hits
        cache.journal("hit", graph_entry)
        fn._boxed_call = True
        if not programs:  # the forward's report: the rewrites ran on Dynamo's graph, as on a miss
            report.decisions = list(captured_decisions) + report.decisions
        REPORTS.append(report)
        counters.graph_compiled(len(report.kernels), report.cache_hits, True)
        programs.append(fn)
    return _Runner(convention, programs[0], programs[1], gm)


def _not_cached(e: cache.Entry | None, reason: str) -> None:
    STATS[f"not cached: {reason}"] += 1
    log.info("kiln: joint cache: AOTAutograd runs for this graph: %s", reason)
    if e is not None:
        cache.journal("miss", e, f"not cacheable: {reason}")


def _store(e: cache.Entry, text: str, convention: Convention) -> bool:
    """Write the entry; whether it was written (not found there already)."""
    def write(folder: Path) -> None:
        folder.mkdir()
        (folder / graph_cache.GRAPH_TEXT).write_text(text)
        (folder / CONVENTION).write_text(json.dumps(asdict(convention)))

    try:
        return not cache.load_or_build(e, write)[1]
    except Exception as err:  # noqa: BLE001 - the programs run: failing to keep the convention loses nothing
        if env_debug():
            raise
        _not_cached(None, f"storing failed ({type(err).__name__}: {err})")
        return False


def aot_module_cached(gm: fx.GraphModule, example_inputs: list[Any], options, *, fw_compiler: Callable,
                      bw_compiler: Callable, partition_fn: Callable, captured_decisions: list = (),
                      **aot_kwargs: Any) -> Callable:
    """aot_module_simplified through the joint cache: on a hit, kiln's own runtime for the
    cached programs; on a miss, AOTAutograd, watching what it gives kiln's compilers, and the
    convention stored once the backward (or the inference program) is compiled.
    captured_decisions: the rewrites of Dynamo's graph, which a hit's forward report shows."""
    from torch._functorch.aot_autograd import aot_module_simplified

    from kiln.codegen.backends import resolve_target
    from kiln.frontend import precompile
    from kiln.frontend.importer import graph_device

    def aot(fw: Callable, bw: Callable, part: Callable) -> Callable:
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw, bw_compiler=bw, partition_fn=part,
                                     **aot_kwargs)

    def through_aot() -> Callable:
        return aot(fw_compiler, bw_compiler, partition_fn)

    if not env_graph_cache() or os.environ.get("KILN_JOINT_CACHE", "1") in ("0", ""):
        return through_aot()
    if getattr(options, "check", False):  # the numerics check compiles, as the graph cache's skip
        return through_aot()
    t0 = time.perf_counter()
    reason = _plain_graph_reason(gm, example_inputs, options)
    if reason:
        _not_cached(None, reason)
        return through_aot()
    device = graph_device(example_inputs)
    target = resolve_target(options.target, device)
    try:
        e, text = _entry(gm, example_inputs, options, target, device)
    except Exception as err:  # noqa: BLE001 - a graph the key cannot name takes AOTAutograd's path
        if env_debug() and not isinstance(err, graph_cache.Uncacheable):
            raise
        _not_cached(None, str(err))
        return through_aot()
    precompile.record(gm, e.path.name, e.components, options, target, device)  # if Dynamo packages it
    problem = cache.check(e)
    if problem is None:
        try:
            runner = load_runner(e, gm, options, target, t0, captured_decisions)
            STATS["hit"] += 1
            cache.journal("hit", e)
            return runner
        except _ProgramGone as err:  # the convention holds: the whole-graph cache rebuilds the program
            problem = str(err)
            cache.journal("miss", e, problem)
        except Exception as err:  # noqa: BLE001 - a stale entry: AOTAutograd again, as on a miss
            problem = f"not loadable ({type(err).__name__}: {err})"
            cache.discard(e, problem)
    STATS["miss"] += 1
    return _watched_compile(e, text, len(example_inputs), fw_compiler, bw_compiler, partition_fn, aot)


def _watched_compile(e: cache.Entry, text: str, num_inputs: int, fw_compiler: Callable, bw_compiler: Callable,
                     partition_fn: Callable, aot: Callable) -> Callable:
    split = _Split()

    def watched_partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any):
        fw, bw = partition_fn(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        split.num_user_outputs = num_fwd_outputs
        split.saved = tuple(n.name if isinstance(n, fx.Node) else "" for n in _outputs(fw)[num_fwd_outputs:])
        placeholders = _placeholders(bw)
        split.backward_placeholders = tuple(n.name for n in placeholders)
        split.tangent_layouts_plain = all(
            not isinstance(v := n.meta.get("val"), torch.Tensor) or v.is_contiguous()
            for n in placeholders if _tangent_number(n.name) is not None)
        split.backward_outputs = tuple(isinstance(o, fx.Node) for o in _outputs(bw))
        return fw, bw

    def watched_forward(g: fx.GraphModule, inputs: list[Any]) -> Callable:
        split.meta = _current_metadata()
        split.num_forward_inputs = len(_placeholders(g))
        fn = fw_compiler(g, inputs)
        split.forward_entry = graph_cache.ENTRY_OF.get(g)
        if split.num_user_outputs < 0:
            _keep(e, text, split, num_inputs, None)
        return fn

    def watched_backward(g: fx.GraphModule, inputs: list[Any]) -> Callable:
        fn = bw_compiler(g, inputs)
        _keep(e, text, split, num_inputs, graph_cache.ENTRY_OF.get(g))
        return fn

    watched_backward = torch.compiler.disable(watched_backward)  # as bw_compiler: compiled lazily
    return aot(watched_forward, watched_backward, watched_partition)


def _keep(e: cache.Entry, text: str, split: _Split, num_inputs: int, backward_entry: str | None) -> None:
    try:
        convention = convention_of(split, num_inputs, backward_entry)
    except NotPlain as err:
        _not_cached(e, str(err))
        return
    if _store(e, text, convention):
        STATS["stored"] += 1

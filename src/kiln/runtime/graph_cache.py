"""The whole-graph cache: one entry per ATen graph kiln compiles (an inference graph, a
training forward or backward), so that a warm process runs none of kiln's passes.

The key names everything that changes the compiled program, each as a component that
`kiln cache why` can name: the graph's canonical text (every call with all its arguments,
constants by a digest of their values), each input's dtype, shape, stride, offset, device
and requires_grad, the options that change code, a digest of kiln's own source, the torch,
Triton and C++ compiler versions, and the device.

An entry is a folder: the canonical text (graph.txt, for `kiln cache why`), the host program
as data (host.json and its tensor constants), the kernels' IR and sources (kernels.pkl,
kiln's own plain dataclasses) and, for GPU kernels, their compiled binaries (binaries.json
and cubins/: each launch configuration's cubin and launch metadata), which a hit launches
through the CUDA driver without Triton. C++ libraries stay in their own content-addressed
entries (cpp/), shared between graphs and checked before each load; a hit asks the backend
for them, which finds them in the cache and compiles nothing. A program holding objects
that do not serialize is not cached (counted in STATS).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import os
import pickle
import time
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from kiln import errors
from kiln.frontend.user_triton import cache_text_kwargs, is_user_kernel_op
from kiln.ir.host import HostProgram, constants_blob, op_name, tensor_digest
from kiln.ir.kernel import size_params
from kiln.options import env_debug, env_graph_cache, env_stored_binaries
from kiln.runtime import cache

FOLDER = "graph"
KIND = "graph"
GRAPH_TEXT = "graph.txt"
BINARIES = "binaries.json"
CUBINS = "cubins"
# What the graph cache did in this process: "hit", "miss", "not cached" (and why).
STATS: Counter = Counter()
# The entry folder each graph's program was loaded from or stored as (the joint cache names them).
ENTRY_OF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

_SOURCE_SUFFIXES = (".py", ".h")


class Uncacheable(Exception):
    """A graph whose text cannot name everything in it (a symbolic size, an unnamed callable)."""


# ---- the key ------------------------------------------------------------------------------


def _value_text(v: Any, names: dict[fx.Node, str]) -> str:
    if isinstance(v, fx.Node):
        return names[v]
    if v is None or v is Ellipsis or isinstance(v, (bool, int, str, complex)):
        return repr(v)
    if isinstance(v, float):
        return repr(v)  # repr keeps -0.0, inf and nan apart
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_value_text(x, names) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner},)"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {_value_text(x, names)}" for k, x in v.items()) + "}"
    if isinstance(v, slice):
        return "slice" + _value_text((v.start, v.stop, v.step), names)
    if isinstance(v, torch.Tensor):
        if isinstance(v, torch._subclasses.FakeTensor) or v.is_meta:
            raise Uncacheable("a constant tensor without values")
        return f"tensor {v.dtype} {list(v.shape)} stride {list(v.stride())} {tensor_digest(v)}"
    if isinstance(v, fx.GraphModule):
        return "graph{" + "; ".join(graph_lines(v)) + "}"
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Uncacheable("a symbolic size in the graph")
    raise Uncacheable(f"a value of type {type(v).__name__} in the graph")


def _target_text(target: Any) -> str:
    name = op_name(target) or _python_name(target)
    if name is None:
        raise Uncacheable(f"a call to {target!r}, which no name leads back to")
    return name


def _python_name(target: Any) -> str | None:
    """The dotted name FX prints a Dynamo graph's call by (torch.rsqrt, operator.add), when
    importing that name gives back target itself."""
    try:
        name = fx.node._get_qualified_name(target)
        module, _, attribute = name.rpartition(".")
        obj: Any = importlib.import_module(module)
        return f"py {name}" if getattr(obj, attribute) is target else None
    except Exception:  # noqa: BLE001 - a name that does not lead back: the graph is not cached
        return None


def graph_lines(gm: fx.GraphModule) -> list[str]:
    """The canonical text of an FX graph, a line a node: values named by position (v0, v1,
    ...), every call with its target's qualified name and all its arguments."""
    names: dict[fx.Node, str] = {}
    lines = []
    for i, n in enumerate(gm.graph.nodes):
        names[n] = name = f"v{i}"
        if n.op == "placeholder":
            lines.append(f"{name} = input")
        elif n.op == "get_attr":
            lines.append(f"{name} = constant {_value_text(_attribute(gm, n.target), names)}")
        elif n.op in ("call_function", "call_method"):
            target = _target_text(n.target) if n.op == "call_function" else f"method {n.target}"
            args = [_value_text(a, names) for a in n.args]
            args += [f"{k}={_value_text(v, names)}" for k, v in _named_kwargs(n).items()]
            origin = n.meta.get("original_aten")  # lowerings read it (which check an index gets)
            lines.append(f"{name} = {target}({', '.join(args)})" + (f" from {origin}" if origin else ""))
        elif n.op == "output":
            lines.append(f"return {_value_text(n.args[0], names)}")
        else:
            raise Uncacheable(f"a {n.op} node")
    return lines


def _named_kwargs(n: fx.Node) -> dict[str, Any]:
    """A call's kwargs as the key names them: a user's Triton kernel by name and source, not
    by its index in this process's side table."""
    if not is_user_kernel_op(n.target):
        return n.kwargs
    try:
        return cache_text_kwargs(n.kwargs)
    except LookupError as error:
        raise Uncacheable(str(error)) from error


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def input_components(example_inputs: list[Any]) -> dict[str, str]:
    parts = {}
    for k, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            parts.update({
                f"input {k} dtype": str(x.dtype), f"input {k} shape": str(list(x.shape)),
                f"input {k} stride": str(list(x.stride())), f"input {k} offset": str(x.storage_offset()),
                f"input {k} device": str(x.device), f"input {k} requires_grad": str(x.requires_grad),
            })
        elif x is None or isinstance(x, (bool, int, float, str)):
            parts[f"input {k}"] = f"{type(x).__name__} {x!r}"
        elif isinstance(x, torch.SymInt):
            parts[f"input {k}"] = f"size {x.node.expr}"
        else:
            raise Uncacheable(f"input {k} of type {type(x).__name__}")
    parts.update(_family_ranges(example_inputs))
    return parts


def _family_ranges(example_inputs: list[Any]) -> dict[str, str]:
    """The range of each size symbol of a shape family's inputs: a program compiled knowing a
    size is at most 64 (say) must not serve a family without that bound."""
    symbols: dict[str, Any] = {}
    for x in example_inputs:
        sizes = [x] if isinstance(x, torch.SymInt) else list(x.shape) + list(x.stride()) \
            if isinstance(x, torch.Tensor) else []
        for s in sizes:
            if isinstance(s, torch.SymInt):
                env = s.node.shape_env
                for sym in s.node.expr.free_symbols:
                    symbols[str(sym)] = env.var_to_range.get(sym)
    return {f"size {name} range": str(r) for name, r in sorted(symbols.items())}


@functools.cache
def kiln_source_digest() -> str:
    """A digest of kiln's own source files: any change to kiln may change what it generates."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES and p.is_file()):
        h.update(f"{path.relative_to(root)}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def machine_components(target: str, device: torch.device) -> dict[str, str]:
    """What the generated code depends on beyond the graph: the code generator's tools and
    the machine (C++ code is tuned to the thread count and built for this CPU)."""
    if target == "cpp":
        from kiln.runtime import cpp_build

        return {"compiler": cache.compiler_version(cpp_build.cxx()), "cpu": cache.cpu_model(),
                "cpu threads": str(torch.get_num_threads()), "cpu cores": str(os.cpu_count())}
    from kiln.runtime import triton_build

    parts = triton_build.versions()
    if device.type == "cpu":
        parts["cpu"] = cache.cpu_model()
    return parts


@dataclass(frozen=True)
class GraphKey:
    components: dict[str, str]
    text: str  # the graph's canonical text (its digest is the "graph" component)


def graph_key(gm: fx.GraphModule, example_inputs: list[Any], options, target: str,
              device: torch.device) -> GraphKey:
    """The key of one graph's compiled program; raises Uncacheable where the graph's text
    cannot name all of it."""
    text = "\n".join(graph_lines(gm)) + "\n"
    components = cache.key_components(**{
        "graph": cache.text_digest(text), "graph nodes": str(text.count("\n")),
        **input_components(example_inputs), **process_components(options, target, device),
    })
    return GraphKey(components, text)


def process_components(options, target: str, device: torch.device) -> dict[str, str]:
    """The key components the process decides, not the graph: options, kiln's source, tools
    and machine (a saved key is checked against them before its entry is trusted elsewhere)."""
    return {**options.cache_key(), "option resolved target": target, "kiln source": kiln_source_digest(),
            **machine_components(target, device)}


# ---- entries ------------------------------------------------------------------------------


def _store(e: cache.Entry, key: GraphKey, report, made: list[errors.Fallback]) -> Path | str:
    """Write the entry of a compiled program and the fallback records its compile made;
    where it was stored, or why it was not."""
    try:
        host = json.dumps(report.host_program.to_dict())
    except ValueError as err:  # an object no name resolves: the program runs, uncached
        return str(err)
    try:
        constants = constants_blob(report.host_program)
        snapshot = pickle.dumps({
            "kernels": report.kernels, "sources": report.sources, "decisions": report.decisions,
            "fallbacks": report.fallbacks, "graph_text": report.graph_text, "source_map": report.source_map,
            "node_origins": report.node_origins, "buffer_layouts": report.buffer_layouts,
            "fallback records": [dataclasses.astuple(f) for f in made],
            "passes": [(p.name, p.seconds, p.summary) for p in report.passes],
        }, protocol=pickle.HIGHEST_PROTOCOL)

        binaries = _binaries(report)

        def write(folder: Path) -> None:
            folder.mkdir()
            (folder / GRAPH_TEXT).write_text(key.text)
            (folder / "host.json").write_text(host)
            (folder / "constants.pt").write_bytes(constants)
            (folder / "kernels.pkl").write_bytes(snapshot)
            if binaries is not None:
                write_binaries(folder, binaries)

        stored, _ = cache.load_or_build(e, write)
    except Exception as err:  # noqa: BLE001 - the program is compiled: failing to keep it loses nothing
        if env_debug():
            raise
        return f"storing failed ({type(err).__name__}: {err})"
    return stored


def _binaries(report) -> dict[str, list] | None:
    """Every kernel's binaries, when each kernel has them (a GPU program): else None, and
    where a GPU kernel's binary cannot be stored, STATS counts why."""
    stored = {k.name: report.binaries.get(k.name) for k in report.kernels}
    reasons = [b for b in stored.values() if isinstance(b, str)]
    if reasons:
        STATS[f"binaries not stored: {reasons[0]}"] += 1
    if not stored or not all(isinstance(b, list) and b for b in stored.values()):
        return None
    return stored


def write_binaries(folder: Path, binaries: dict[str, list]) -> None:
    """binaries.json (each kernel's binaries' metadata) and their cubins, named by digest."""
    (folder / CUBINS).mkdir()
    for stored in binaries.values():
        for b in stored:
            (folder / CUBINS / f"{b.cubin_sha256}.cubin").write_bytes(b.cubin)
    data = {name: [b.to_dict() for b in stored] for name, stored in binaries.items()}
    (folder / BINARIES).write_text(json.dumps(data, indent=1))


def read_binaries(folder: Path) -> dict[str, list] | None:
    """The binaries write_binaries wrote, or None when the folder holds none."""
    from kiln.runtime.triton_abi import KernelBinary

    if not (folder / BINARIES).is_file():
        return None
    data = json.loads((folder / BINARIES).read_text())
    return {name: [KernelBinary.from_dict(d, (folder / CUBINS / f"{d['cubin_sha256']}.cubin").read_bytes())
                   for d in stored] for name, stored in data.items()}


def _runs_here(binaries: dict[str, list]) -> bool:
    """Whether the binaries can run on this process's GPU (the key names the GPU already)."""
    from kiln.runtime import triton_build

    if triton_build.interpreted() or not torch.cuda.is_available():
        return False
    major, minor = torch.cuda.get_device_capability()
    return all(b.arch == major * 10 + minor for stored in binaries.values() for b in stored)


def _launchers(folder: Path, kernels: list, sources: list[str], backend) -> tuple[list[Callable], int, str]:
    """The kernels' launchers: from the entry's binaries where it holds them for this GPU,
    else built by the backend (which finds them in its cache); how many came from a cache
    and where from."""
    binaries = read_binaries(folder) if env_stored_binaries() else None
    if binaries is not None and set(binaries) >= {k.name for k in kernels} and _runs_here(binaries):
        from kiln.runtime import triton_build

        stored = [binaries[k.name] for k in kernels]
        return triton_build.launchers_from_binaries(kernels, sources, stored), len(kernels), "stored binaries"
    launchers, hits = backend.build(kernels, sources)
    return launchers, hits, "cache"


def _load(folder: Path, backend, t0: float) -> tuple[Callable, Any]:
    """The program of an entry, with its kernels from the backend's cache (t0: when the
    lookup began, its key included)."""
    from kiln.codegen import host as host_codegen
    from kiln.passes.report import CompileReport, PassRecord

    snapshot = pickle.loads((folder / "kernels.pkl").read_bytes())
    host = HostProgram.from_dict(json.loads((folder / "host.json").read_text()),
                                 (folder / "constants.pt").read_bytes())
    kernels = snapshot["kernels"]
    # built as the compile builds them: a family's sizes as the kernels' parameters
    sources = [snapshot["sources"][k.name] for k in kernels]
    launchers, hits, found_in = _launchers(folder, [size_params(k) for k in kernels], sources, backend)
    call, host_source = host_codegen.load_with_source(host, {k.name: f for k, f in zip(kernels, launchers)})
    report = CompileReport(backend=backend.name, graph_text=snapshot["graph_text"],
                           decisions=snapshot["decisions"], fallbacks=snapshot["fallbacks"], kernels=kernels,
                           sources=snapshot["sources"], host_program=host, host_source=host_source,
                           cache_hits=hits, from_cache=folder.name, program=weakref.ref(call),
                           source_map=snapshot.get("source_map", {}),
                           node_origins=snapshot.get("node_origins", {}),
                           buffer_layouts=snapshot.get("buffer_layouts", {}),
                           binaries={k.name: f.binaries() for k, f in zip(kernels, launchers)
                                     if hasattr(f, "binaries")})
    for record in snapshot["fallback records"]:  # what runs in ATen, told as a compile tells it
        errors.record(errors.Fallback(*record))
    compiled = sum(seconds for _, seconds, _ in snapshot["passes"])
    report.passes.append(PassRecord(
        "graph cache", time.perf_counter() - t0,
        f"hit {FOLDER}/{folder.name}: no pass run (they took {compiled:.3f} s); "
        f"{len(kernels) - hits} kernels compiled, {hits} from {found_in}"))
    return call, report


def compile_cached(gm: fx.GraphModule, example_inputs: list[Any], options, target: str,
                   backend) -> tuple[Callable, Any]:
    """compile_graph through the graph cache: on a hit, the stored program and its kernels;
    on a miss, compile and store the result."""
    from kiln.frontend.importer import graph_device
    from kiln.passes.pipeline import PassRecord, compile_graph

    if not env_graph_cache():
        return compile_graph(gm, example_inputs, backend)
    t0 = time.perf_counter()
    device = graph_device(example_inputs)
    try:
        with unset_fake_temporarily():  # constants' digests read real tensors inside AOTAutograd's mode
            key = graph_key(gm, example_inputs, options, target, device)
    except Exception as e:  # noqa: BLE001 - a graph the key cannot name compiles uncached
        if env_debug() and not isinstance(e, Uncacheable):
            raise
        STATS[f"not cached: {e}"] += 1
        return compile_graph(gm, example_inputs, backend)
    e = cache.entry("graph", FOLDER, "graph", "", key.components)
    problem = cache.check(e)
    if problem is None:
        try:
            result = _load(e.path, backend, t0)
            ENTRY_OF[gm] = e.path.name
            STATS["hit"] += 1
            cache.journal("hit", e)
            return result
        except Exception as err:  # noqa: BLE001 - a stale entry: compile again, as on a miss
            problem = f"not loadable ({type(err).__name__}: {err})"
            cache.discard(e, problem)
    STATS["miss"] += 1
    lookup = time.perf_counter() - t0
    with errors.collect() as made:
        call, report = compile_graph(gm, example_inputs, backend)
    t1 = time.perf_counter()
    if any(f.kind == "internal" for f in made):  # a kiln bug made this program: not kept
        STATS["not cached: kiln raised while compiling"] += 1
        return call, report
    stored = _store(e, key, report, made)
    if isinstance(stored, str):
        STATS[f"not cached: {stored}"] += 1
        return call, report
    ENTRY_OF[gm] = stored.name
    report.passes.append(PassRecord("graph cache", lookup + time.perf_counter() - t1,
                                    f"miss ({'not in the cache' if problem == 'missing' else problem}): "
                                    f"stored as {FOLDER}/{e.path.name}"))
    return call, report


def graph_difference(a: Path, b: Path) -> str | None:
    """The first line in which the canonical texts of two graph entries differ."""
    try:
        lines_a = (a / GRAPH_TEXT).read_text().splitlines()
        lines_b = (b / GRAPH_TEXT).read_text().splitlines()
    except OSError:
        return None
    for k, (x, y) in enumerate(zip(lines_a, lines_b)):
        if x != y:
            return f"graph text line {k + 1} differs: {x} -> {y}"
    if len(lines_a) != len(lines_b):
        return f"graph text has {len(lines_a)} lines there, {len(lines_b)} here"
    return None

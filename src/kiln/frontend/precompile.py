"""kiln in Dynamo's caching precompile: a warm process that runs no Dynamo tracing.

Under `TORCH_CACHING_PRECOMPILE=1` (torch._dynamo.config.caching_precompile) Dynamo saves
what it made of a function (its transformed bytecode and guards) and, for each graph, an
artifact its backend recorded. A later process loads them instead of tracing, and asks each
artifact for its compiled callable. kiln's artifact names the joint-cache entry of the graph
(whose programs and kernels are in the whole-graph cache), the key components that entry was
made under, the options and the target; loading it runs none of kiln's passes, no AOTAutograd
and no code generator. An entry made by another kiln, Triton, compiler or machine, or one that
is gone, is not used: kiln warns and compiles the saved graph at its first call.

Only graphs the joint cache holds get an artifact (see training_cache: plain calling
conventions, static shapes); for any other graph Dynamo saves the function's code as bypassed
and traces it in the next process, as without precompile. Dynamo writes its cache when
`torch.compiler.save_cache_artifacts()` is called; kiln calls it at exit too, once it has
recorded an artifact, so that a training script needs no change beyond the variable."""

from __future__ import annotations

import atexit
import pickle
import time
from typing import Any, Callable

import torch
import torch.fx as fx
from torch._dynamo.precompile_context import BackendCacheArtifact, PrecompileContext

from kiln import logs

log = logs.cache
_SAVE_AT_EXIT: list[bool] = []


def enabled() -> bool:
    return bool(getattr(torch._dynamo.config, "caching_precompile", False))


def backend_id(gm: fx.GraphModule) -> str | None:
    """The name Dynamo gives the graph's compiled function when it packages it, else None."""
    name = getattr(gm, "_backend_id", None) if enabled() else None
    return name if isinstance(name, str) else None


def record(gm: fx.GraphModule, joint_folder: str, components: dict[str, str], options: Any,
           target: str, device: torch.device) -> None:
    """Record the artifact of a graph whose programs the joint cache holds (or will hold once
    its backward is compiled)."""
    name = backend_id(gm)
    if name is None:
        return
    try:
        graph = pickle.dumps(gm)  # for a fallback, unpickled only if one is needed
    except Exception as err:  # noqa: BLE001 - Dynamo saves the function as bypassed: traced again
        log.info("kiln: a graph not saved for precompile: it does not pickle (%s: %s)",
                 type(err).__name__, err)
        return
    content = {"joint": joint_folder, "components": dict(components), "options": options,
               "target": target, "device": str(device), "graph": graph}
    PrecompileContext.record_artifact(KilnArtifact(name, content))
    if not _SAVE_AT_EXIT:
        _SAVE_AT_EXIT.append(True)
        atexit.register(_save)


def _save() -> None:
    try:
        torch.compiler.save_cache_artifacts()
    except Exception as err:  # noqa: BLE001 - at exit: the next process traces, nothing is lost
        log.warning("kiln: Dynamo's precompile cache was not saved: %s: %s", type(err).__name__, err)


class _PickledGraph:
    """Dynamo's graph, unpickled at its first use."""

    def __init__(self, data: bytes):
        self.data, self.gm = data, None

    def get(self) -> fx.GraphModule:
        if self.gm is None:
            self.gm = pickle.loads(self.data)
        return self.gm

    @property
    def forward(self) -> Callable:  # the runner's fallback to ATen
        return self.get().forward


class _CompileAtFirstCall:
    """A graph whose saved programs this process cannot use: kiln compiles it from the saved
    graph at its first call, with that call's inputs as the example (Dynamo's own fallback,
    an error raised here, would trace the function again and fails in some versions)."""

    def __init__(self, graph: _PickledGraph, options: Any):
        self.graph, self.options, self.fn = graph, options, None

    def __call__(self, *args: Any) -> Any:
        if self.fn is None:
            from kiln.frontend.backend import kiln_backend

            self.fn = kiln_backend(self.graph.get(), list(args), options=self.options)
        return self.fn(*args)


def _stale(content: dict) -> str | None:
    """Which key component of the joint entry this process would make differently, or None:
    the entry was made by another kiln, tool version or machine."""
    from kiln.runtime import graph_cache

    stored = content["components"]
    device = torch.device(content["device"])
    now = graph_cache.process_components(content["options"], content["target"], device)
    for name, value in now.items():
        if name in stored and stored[name] != value:
            return f"{name} differs ({stored[name]} when saved, {value} now)"
    return None


class KilnArtifact(BackendCacheArtifact):
    """A graph's compiled programs, by the joint-cache entry that names them (Dynamo's
    dataclass: key and content)."""

    def after_deserialization(self) -> Callable:
        from kiln.runtime import cache, training_cache

        t0 = time.perf_counter()
        content = self.content
        folder = cache.cache_dir(training_cache.FOLDER) / content["joint"]
        key = content["joint"].rsplit("_", 1)[-1]
        e = cache.Entry(training_cache.KIND, key, folder, content["components"])
        problem = _stale(content) or cache.check(e)
        graph = _PickledGraph(content["graph"])
        if problem is not None:
            from torch._dynamo.package import DynamoCache

            log.warning("kiln: a graph from Dynamo's precompile cache is compiled again at its first "
                        "call: %s; so it is in every process until that cache is cleared (%s)",
                        problem, DynamoCache.path_prefix())
            return _CompileAtFirstCall(graph, content["options"])
        runner = training_cache.load_runner(e, graph, content["options"], content["target"], t0)
        training_cache.STATS["precompiled"] += 1
        log.info("kiln: a precompiled graph loaded in %.3f s", time.perf_counter() - t0)
        return runner

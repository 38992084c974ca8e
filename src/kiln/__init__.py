"""kiln: a compiler for PyTorch programs.

    torch.compile(model, backend="kiln")      # after `pip install`
    kiln.compile(model, fullgraph=False, dynamic=None, mode="default")
    kiln.compile(model, check=True)           # first call: every kernel held against float64
    kiln.export(model, example_args, "model.kiln"); kiln.load("model.kiln")(*args)
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from typing import Any, Callable

import torch

from kiln import logs
from kiln.options import Options

__version__ = "0.1.0"
logs.configure()  # KILN_LOGS, and TORCH_LOGS's names for kiln's topics
__all__ = ["compile", "jit", "explain", "export", "load", "stats", "reset_stats", "Options", "__version__"]


def compile(model_or_fn: Callable | None = None, **options: Any) -> Callable:
    """Compile a module or function with kiln; unknown options are an error here."""
    opts = Options.from_kwargs(**options)
    if model_or_fn is None:
        return functools.partial(compile, **options)
    if not callable(model_or_fn):
        raise TypeError(
            f"kiln.compile needs a torch.nn.Module or a function, got {type(model_or_fn).__name__}"
        )
    from kiln.frontend.distributed import compile_wrapped

    # the backend's module (AOTAutograd, the compiler) is imported at the first compile: a warm
    # start from Dynamo's precompile cache may need none of it
    backend = functools.partial(_kiln_backend, options=opts)

    def compile_module(module: torch.nn.Module) -> None:
        module.compile(backend=backend, fullgraph=opts.fullgraph, dynamic=opts.dynamic)

    wrapped = compile_wrapped(model_or_fn, compile_module)
    if wrapped is not None:
        return wrapped
    return torch.compile(model_or_fn, backend=backend, fullgraph=opts.fullgraph, dynamic=opts.dynamic)


def jit(fn: Callable | None = None, **options: Any) -> Callable:
    """Decorator form: @kiln.jit or @kiln.jit(fullgraph=True)."""
    if fn is None:
        return lambda f: compile(f, **options)
    return compile(fn, **options)


def _backend_entry_point_installed() -> bool:
    """Whether Dynamo finds `backend="kiln"` through the installed package's entry point."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("kiln")
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(ep.group == "torch_dynamo_backends" and ep.name == "kiln" for ep in dist.entry_points)


def _kiln_backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
    from kiln.frontend.backend import kiln_backend

    return kiln_backend(gm, example_inputs, **kwargs)


def _register_backend() -> None:
    # imports nothing of Dynamo's backends: this may run while torch._functorch is importing
    from torch._dynamo.backends.registry import register_backend

    try:
        register_backend(_kiln_backend, name="kiln")
    except AssertionError:  # registered already
        pass


class _RegisterOnDynamoImport:
    """Registers the backend right after torch._dynamo is imported: a source checkout has no
    entry point, and importing Dynamo here would cost a second that loading an artifact,
    which never needs Dynamo, must not pay."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                _register_backend()

            spec.loader.exec_module = exec_module
        return spec


if not _backend_entry_point_installed():
    if "torch._dynamo" in sys.modules:
        _register_backend()
    else:
        sys.meta_path.insert(0, _RegisterOnDynamoImport())


def explain(fn: Callable, *args: Any, options: dict | None = None, measure: bool = False, **kwargs: Any):
    """Compile fn with kiln (options: kiln.compile's) on args and kwargs (fn's own keyword
    inputs, and explain's show_kernels= and show_source=); return what kiln did as data
    (kiln.tools.explain.Explanation: passes, decisions, kernels and their costs, break-even),
    whose str() is the text. measure=True also times eager, the compiled call and each kernel.
    What was compiled before stays compiled."""
    from kiln.tools.explain import explain as _explain

    return _explain(fn, *args, options=options, measure=measure, **kwargs)


def export(fn_or_module: Callable, example_args: tuple, path: str, dynamic_shapes: Any = None):
    """Compile fn_or_module for example_args ahead of time (torch.export, then kiln) and write
    an artifact folder at path that kiln.load runs without Dynamo or a compiler."""
    from kiln.runtime.artifact import export as _export

    return _export(fn_or_module, example_args, path, dynamic_shapes)


def load(path: str) -> Callable:
    """An artifact written by kiln.export, as a callable of the inputs it was exported for."""
    from kiln.runtime.artifact import load as _load

    return _load(path)


def stats():
    """What kiln did in this process: graphs compiled, programs per symbolic-shape graph,
    kernels built and found in the cache, graphs and ops run in ATen (kiln.stats.Stats)."""
    from kiln import counters as _stats

    return _stats.snapshot()


def reset_stats() -> None:
    from kiln import counters as _stats

    _stats.reset()

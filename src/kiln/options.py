"""kiln's options: one typed object, and the only place KILN_* environment variables are read."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

MODES = ("default", "reduce-overhead", "max-autotune")
TARGETS = ("auto", "cpp", "triton")


@dataclass(frozen=True)
class Options:
    """Options of kiln.compile.

    fullgraph: raise on a graph break instead of splitting the program.
    dynamic: None (the default) lets Dynamo decide: once an input's shape changes, Dynamo
        traces the graph with symbolic shapes, and kiln compiles it once for its shape family
        (per shape where it needs a number, or with KILN_SYMBOLIC=0); True traces symbolic
        shapes from the start; False has Dynamo trace each new
        shape on its own (and patch its configuration around every call, which costs host
        time).
    mode: "default", "reduce-overhead" (CUDA graphs where possible) or "max-autotune".
    target: code generator: "auto" (C++ for CPU tensors), "cpp" or "triton".
    check: check numerics at each graph's first call: every kernel against its tensor-IR ops
        evaluated in float64 (docs/numerics_check.md); checked graphs skip the graph cache.
    eager_random: leave dropout, rand, randn and bernoulli to ATen, keeping eager's random
        stream (and a saved dropout mask); by default kiln generates them inside its kernels
        from a Philox stream of its own (docs/random.md). KILN_EAGER_RANDOM=1 sets it.
    matmul_templates: matmul templates with fused epilogues (passes/matmul.py; Triton on
        GPUs, C++ on CPUs): None (the default) lets the cost model choose them per matmul;
        True uses them wherever they apply (the Triton interpreter included); False keeps
        every matmul in ATen (cuBLAS, oneDNN). KILN_MATMUL_TEMPLATES=0/1 sets it.
    """

    fullgraph: bool = False
    dynamic: bool | None = None
    mode: str = "default"
    target: str = "auto"
    check: bool = False
    eager_random: bool = False
    matmul_templates: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.fullgraph, bool):
            raise TypeError(f"kiln option fullgraph must be a bool, got {self.fullgraph!r}")
        if self.dynamic not in (None, True, False):
            raise TypeError(f"kiln option dynamic must be None, True or False, got {self.dynamic!r}")
        if self.mode not in MODES:
            raise ValueError(f"kiln option mode must be one of {MODES}, got {self.mode!r}")
        if self.target not in TARGETS:
            raise ValueError(f"kiln option target must be one of {TARGETS}, got {self.target!r}")
        if not isinstance(self.check, bool):
            raise TypeError(f"kiln option check must be a bool, got {self.check!r}")
        if not isinstance(self.eager_random, bool):
            raise TypeError(f"kiln option eager_random must be a bool, got {self.eager_random!r}")
        if self.matmul_templates not in (None, True, False):
            raise TypeError(f"kiln option matmul_templates must be None, True or False, got "
                            f"{self.matmul_templates!r}")

    def cache_key(self) -> dict[str, str]:
        """The fields that change generated code, as named key components. fullgraph and
        dynamic act in Dynamo, before kiln sees a graph."""
        return {f"option {name}": str(getattr(self, name)) for name in CODE_OPTIONS}

    @classmethod
    def from_kwargs(cls, **kwargs) -> "Options":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown kiln option(s) {unknown}; known options: {sorted(known)}")
        if "target" not in kwargs and env_target():
            kwargs["target"] = env_target()
        if "check" not in kwargs and env_check():
            kwargs["check"] = True
        if "eager_random" not in kwargs and env_eager_random():
            kwargs["eager_random"] = True
        if "matmul_templates" not in kwargs and env_matmul_templates() is not None:
            kwargs["matmul_templates"] = env_matmul_templates()
        return cls(**kwargs)


# The options that change the code kiln generates for a graph (the graph cache's key).
CODE_OPTIONS = ("mode", "target", "eager_random", "matmul_templates")

# The options torch.compile(model, backend="kiln", mode=..., options={...}) hands to kiln; its
# own fullgraph= and dynamic= act in Dynamo, before kiln, so they are not kiln's to take here.
BACKEND_OPTIONS = ("mode", "target", "check", "eager_random", "matmul_templates")


def backend_options(mode: str | None = None, options: dict | None = None) -> Options:
    """kiln's options from torch.compile's mode= and options=; a bad name or value is an error."""
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"torch.compile(backend='kiln', options=...) takes a dict, got {options!r}")
    options = dict(options or {})
    unknown = sorted(set(options) - set(BACKEND_OPTIONS))
    if unknown:
        raise TypeError(f"unknown kiln option(s) {unknown} in torch.compile(options=...); kiln takes "
                        f"{list(BACKEND_OPTIONS)} there (fullgraph and dynamic are torch.compile's own "
                        "arguments)")
    if mode is not None:
        if "mode" in options and options["mode"] != mode:
            raise ValueError(f"kiln option mode given twice: {mode!r} and options['mode'] = "
                             f"{options['mode']!r}")
        options["mode"] = mode
    return Options.from_kwargs(**options)


def env_cache_dir() -> str:
    return os.environ.get("KILN_CACHE_DIR") or str(Path.home() / ".cache" / "kiln")


def env_target() -> str | None:
    value = os.environ.get("KILN_TARGET")
    if value and value not in TARGETS:
        raise ValueError(f"KILN_TARGET must be one of {TARGETS}, got {value!r}")
    return value


def env_check() -> bool:
    """KILN_CHECK=1 checks every compiled graph's numerics at its first call (Options.check)."""
    return os.environ.get("KILN_CHECK", "") not in ("", "0")


def env_eager_random() -> bool:
    """KILN_EAGER_RANDOM=1 leaves random ops to ATen, with eager's stream (Options.eager_random)."""
    return os.environ.get("KILN_EAGER_RANDOM", "") not in ("", "0")


def env_matmul_templates() -> bool | None:
    """KILN_MATMUL_TEMPLATES=1 forces matmul templates wherever they apply, 0 turns them off
    (Options.matmul_templates); unset, the cost model chooses."""
    value = os.environ.get("KILN_MATMUL_TEMPLATES", "")
    return None if value == "" else value != "0"


def env_debug() -> bool:
    return os.environ.get("KILN_DEBUG", "") not in ("", "0")


def env_symbolic() -> bool:
    """KILN_SYMBOLIC=0 compiles a graph Dynamo traced with symbolic shapes once per shape it
    meets, as before shape families; by default kiln compiles the family once."""
    return os.environ.get("KILN_SYMBOLIC", "1") not in ("0", "")


def env_gpu_families() -> bool:
    """KILN_GPU_FAMILIES=0 compiles a GPU graph of symbolic shapes once per shape it meets;
    by default a shape family compiles once on GPUs too."""
    return os.environ.get("KILN_GPU_FAMILIES", "1") not in ("", "0")


def env_stored_binaries() -> bool:
    """KILN_STORED_BINARIES=0 builds a graph-cache hit's GPU kernels through Triton's cache;
    by default a hit launches the entry's stored binaries through the CUDA driver."""
    return os.environ.get("KILN_STORED_BINARIES", "1") not in ("", "0")


def env_graph_cache() -> bool:
    """KILN_GRAPH_CACHE=0 compiles every graph, neither loading nor storing whole graphs
    (kernels are still cached)."""
    return os.environ.get("KILN_GRAPH_CACHE", "1") not in ("0", "")


def env_logs() -> str:
    """KILN_LOGS: the log topics to show (kiln/logs.py), e.g. "passes,+fusion,-fallbacks"."""
    return os.environ.get("KILN_LOGS", "")

"""Triton kernels: generated source written to the cache by content hash, imported, and
wrapped in a launcher with the kernel's launch configuration."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

from kiln.ir.kernel import Kernel
from kiln.runtime.cache import atomic_write, cache_dir, content_hash


@dataclass
class TritonBuild:
    fn: Callable
    cached: bool


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _versions() -> str:
    import triton

    parts = [triton.__version__, "interpreter" if interpreted() else ""]
    try:
        import torch

        if torch.cuda.is_available() and not interpreted():
            parts += [torch.version.cuda or "", torch.cuda.get_device_name(), str(torch.cuda.get_device_capability())]
    except Exception:  # noqa: BLE001 - versions only refine the key
        pass
    return " ".join(parts)


def _load(kernel: Kernel, source: str):
    key = content_hash(source, _versions())
    path = cache_dir("triton") / f"{kernel.name}_{key}.py"
    cached = path.exists()
    if not cached:
        atomic_write(path, source)
    spec = importlib.util.spec_from_file_location(f"kiln_triton_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, kernel.name), path, cached


def _interpreted_launcher(kernel: Kernel, jit_fn) -> Callable:
    from kiln.codegen.triton import launch_config

    xblock, rblock, warps = launch_config(kernel, True)
    launcher = jit_fn[((kernel.outer_numel + xblock - 1) // xblock,)]

    def launch(*tensors):
        launcher(*tensors, XBLOCK=xblock, RBLOCK=rblock, num_warps=warps)

    launch.__name__ = kernel.name
    return launch


def build_all(jobs: list[tuple[Kernel, str]], autotune: bool = False) -> list[TritonBuild]:
    """Load every kernel; on a GPU, compile its launch configurations (the heuristic's, or
    with autotune every candidate) for aligned pointers of the kernel's dtypes, submitted
    together to Triton's asynchronous compile mode (on threads: Triton 3.6 holds the GIL
    for most of a compile, so they overlap little; parallel compile across processes is
    still to do). With several candidates the first launch picks the fastest."""
    from kiln.codegen.triton import candidate_configs, launch_config
    from kiln.runtime.autotune import TunedLauncher

    loaded = [_load(kernel, source) for kernel, source in jobs]
    if interpreted() or not jobs:
        return [TritonBuild(_interpreted_launcher(kernel, fn), cached)
                for (kernel, _), (fn, _, cached) in zip(jobs, loaded)]
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime._async_compile import AsyncCompileMode

    configs = [candidate_configs(kernel) if autotune else [launch_config(kernel, False)] for kernel, _ in jobs]
    pending: list[dict] = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        with AsyncCompileMode(pool):
            for (kernel, _), (jit_fn, _, _), cs in zip(jobs, loaded, configs):
                dtypes = [p.dtype for p in kernel.params]
                pending.append({c: jit_fn.warmup(*dtypes, grid=(1,), XBLOCK=c[0], RBLOCK=c[1], num_warps=c[2])
                                for c in cs})
    builds = []
    for (kernel, _), (jit_fn, path, cached), variants in zip(jobs, loaded, pending):
        variants = {c: (v.result() if hasattr(v, "result") else v) for c, v in variants.items()}
        launcher = TunedLauncher(kernel.name, kernel.outer_numel, jit_fn, variants, path.with_suffix(".tune.json"))
        builds.append(TritonBuild(launcher, cached))
    return builds


_POINTER_TYPE = {
    "float32": "*fp32", "float64": "*fp64", "bfloat16": "*bf16", "float16": "*fp16", "int64": "*i64",
    "int32": "*i32", "int16": "*i16", "int8": "*i8", "uint8": "*u8", "bool": "*i1",
}


def compile_for_target(kernel: Kernel, source: str, arch: int = 90, warp_size: int = 32):
    """Compile a generated kernel for a CUDA architecture without a GPU (ahead of time)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile

    from kiln.codegen.triton import launch_config

    jit_fn, _, _ = _load(kernel, source)
    xblock, rblock, warps = launch_config(kernel, False)
    signature = {p.name: _POINTER_TYPE[str(p.dtype).replace("torch.", "")] for p in kernel.params}
    signature.update(XBLOCK="constexpr", RBLOCK="constexpr")
    src = ASTSource(jit_fn, signature, constexprs={"XBLOCK": xblock, "RBLOCK": rblock})
    return triton_compile(src, target=GPUTarget("cuda", arch, warp_size), options={"num_warps": warps})

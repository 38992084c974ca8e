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
    return getattr(module, kernel.name), cached


def _launcher(kernel: Kernel, jit_fn, compiled) -> Callable:
    """Launch with the precompiled binary when every pointer is 16-byte aligned (what it was
    specialized for: kiln's own buffers always are); otherwise through Triton's JIT, which
    picks or compiles the right specialization."""
    from kiln.codegen.triton import launch_config

    xblock, rblock, warps = launch_config(kernel, interpreted())
    grid = ((kernel.outer_numel + xblock - 1) // xblock, 1, 1)
    slow = jit_fn[grid]
    fast = compiled[grid] if compiled is not None else None

    def launch(*tensors):
        if fast is not None and all(t.data_ptr() % 16 == 0 for t in tensors):
            fast(*tensors, xblock, rblock)
        else:
            slow(*tensors, XBLOCK=xblock, RBLOCK=rblock, num_warps=warps)

    launch.__name__ = kernel.name
    return launch


def build_all(jobs: list[tuple[Kernel, str]]) -> list[TritonBuild]:
    """Load every kernel and, on a GPU, compile them all at once on a thread pool (Triton's
    asynchronous compile mode), for aligned pointers of the kernel's dtypes."""
    from kiln.codegen.triton import launch_config

    loaded = [_load(kernel, source) for kernel, source in jobs]
    compiled = [None] * len(jobs)
    if not interpreted() and jobs:
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime._async_compile import AsyncCompileMode

        with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
            with AsyncCompileMode(pool):
                pending = []
                for (kernel, _), (jit_fn, _) in zip(jobs, loaded):
                    xblock, rblock, warps = launch_config(kernel, False)
                    pending.append(jit_fn.warmup(*[p.dtype for p in kernel.params], grid=(1,),
                                                 XBLOCK=xblock, RBLOCK=rblock, num_warps=warps))
        compiled = [p.result() if hasattr(p, "result") else p for p in pending]
    return [TritonBuild(_launcher(kernel, jit_fn, c), cached)
            for (kernel, _), (jit_fn, cached), c in zip(jobs, loaded, compiled)]


_POINTER_TYPE = {
    "float32": "*fp32", "float64": "*fp64", "bfloat16": "*bf16", "float16": "*fp16", "int64": "*i64",
    "int32": "*i32", "int16": "*i16", "int8": "*i8", "uint8": "*u8", "bool": "*i1",
}


def compile_for_target(kernel: Kernel, source: str, arch: int = 90, warp_size: int = 32):
    """Compile a generated kernel for a CUDA architecture without a GPU (ahead of time)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile

    from kiln.codegen.triton import launch_config

    key = content_hash(source, "aot")
    path = cache_dir("triton") / f"{kernel.name}_{key}.py"
    if not path.exists():
        atomic_write(path, source)
    spec = importlib.util.spec_from_file_location(f"kiln_triton_aot_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    xblock, rblock, warps = launch_config(kernel, False)
    signature = {p.name: _POINTER_TYPE[str(p.dtype).replace("torch.", "")] for p in kernel.params}
    signature.update(XBLOCK="constexpr", RBLOCK="constexpr")
    src = ASTSource(getattr(module, kernel.name), signature, constexprs={"XBLOCK": xblock, "RBLOCK": rblock})
    return triton_compile(src, target=GPUTarget("cuda", arch, warp_size), options={"num_warps": warps})

"""Triton kernels: generated source written to the cache by content hash, imported, compiled
for each launch configuration (in worker processes when there are several, see
compile_pool) and wrapped in a launcher."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln.ir.kernel import Kernel
from kiln.runtime import compile_pool
from kiln.runtime.autotune import Config, TunedLauncher
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
    except Exception:  # noqa: BLE001, S110 - versions only refine the key
        pass
    return " ".join(parts)


def _load(kernel: Kernel, source: str):
    key = content_hash(source, _versions())
    path = cache_dir("triton") / f"{kernel.name}_{key}.py"
    cached = path.exists()
    if not cached:
        atomic_write(path, source)
    return getattr(compile_pool.load_module(str(path)), kernel.name), path, cached


def _interpreted_launcher(kernel: Kernel, jit_fn) -> Callable:
    from kiln.codegen.triton import grid, launch_config

    xblock, rblock, warps = launch_config(kernel, True)
    launcher = jit_fn[grid(kernel, (xblock, rblock, warps))]

    def launch(*tensors):
        launcher(*tensors, XBLOCK=xblock, RBLOCK=rblock, num_warps=warps)

    launch.__name__ = kernel.name
    launch.aligned = launch  # the interpreter needs no alignment
    return launch


def build_all(jobs: list[tuple[Kernel, str]], autotune: bool = False) -> list[TritonBuild]:
    """Load every kernel; on a GPU, compile its launch configurations for this GPU. With
    several candidates the first launch picks the fastest."""
    loaded = [_load(kernel, source) for kernel, source in jobs]
    if interpreted() or not jobs:
        return [TritonBuild(_interpreted_launcher(kernel, fn), cached)
                for (kernel, _), (fn, _, cached) in zip(jobs, loaded)]
    from kiln.codegen.triton import assumes_aligned_tensors, grid

    kernels = [(kernel, path) for (kernel, _), (_, path, _) in zip(jobs, loaded)]
    all_variants = compile_variants(kernels, _current_target(), autotune)
    builds = []
    for (kernel, path), (jit_fn, _, cached), variants in zip(kernels, loaded, all_variants):
        launcher = TunedLauncher(kernel.name, functools.partial(grid, kernel), jit_fn, variants,
                                 path.with_suffix(".tune.json"), len(kernel.params),
                                 assumes_aligned_tensors(kernel))
        builds.append(TritonBuild(launcher, cached))
    return builds


def compile_variants(kernels: list[tuple[Kernel, Path]], target: tuple, autotune: bool = False) -> list[dict]:
    """Per kernel (loaded from path), {config: CompiledKernel} for target's (backend, arch,
    warp_size): the heuristic's launch configuration, or with autotune every candidate."""
    from kiln.codegen.triton import candidate_configs, launch_config

    configs = [candidate_configs(kernel) if autotune else [launch_config(kernel, False)] for kernel, _ in kernels]
    jobs = [compile_args(kernel, path, config, target) for (kernel, path), cs in zip(kernels, configs) for config in cs]
    compiled = iter(compile_pool.compile_all(jobs))
    return [{config: next(compiled) for config in cs} for cs in configs]


def _current_target() -> tuple:
    from triton.runtime import driver

    target = driver.active.get_current_target()
    return target.backend, target.arch, target.warp_size


_POINTER_TYPE = {
    "float32": "*fp32", "float64": "*fp64", "bfloat16": "*bf16", "float16": "*fp16", "int64": "*i64",
    "int32": "*i32", "int16": "*i16", "int8": "*i8", "uint8": "*u8", "bool": "*u1",
}


@functools.cache
def _aligned_attr(target: tuple) -> list:
    """The attribute Triton's JIT gives a pointer whose address is a multiple of 16."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    return make_backend(GPUTarget(*target)).parse_attr("D")


def _options(num_warps: int) -> dict:
    """Compile options, with the debug settings Triton's JIT would add from the environment."""
    from triton import knobs

    return {"num_warps": num_warps, "debug": bool(knobs.runtime.debug),
            "instrumentation_mode": knobs.compilation.instrumentation_mode}


def compile_args(kernel: Kernel, path: Path, config: Config, target: tuple) -> compile_pool.CompileArgs:
    """triton.compile's arguments for one launch configuration of a kernel, specialized as
    the JIT specializes tensors that are all 16-byte aligned (the direct launch's condition),
    unless the kernel's rows are not (see below)."""
    xblock, rblock, warps = config
    signature = {p.name: _POINTER_TYPE[str(p.dtype).replace("torch.", "")] for p in kernel.params}
    signature.update(XBLOCK="constexpr", RBLOCK="constexpr")
    from kiln.codegen.triton import assumes_aligned_tensors

    aligned = assumes_aligned_tensors(kernel)
    attrs = {(i,): _aligned_attr(target) for i in range(len(kernel.params))} if aligned else {}
    return compile_pool.CompileArgs(str(path), kernel.name, signature, {"XBLOCK": xblock, "RBLOCK": rblock}, attrs,
                                    tuple(target), _options(warps))


def compile_for_target(kernel: Kernel, source: str, arch: int = 90, warp_size: int = 32):
    """Compile a generated kernel for a CUDA architecture without a GPU (ahead of time)."""
    from kiln.codegen.triton import launch_config

    _, path, _ = _load(kernel, source)
    return compile_pool.compile_in_process(compile_args(kernel, path, launch_config(kernel, False),
                                                        ("cuda", arch, warp_size)))

"""Code generators, chosen by target. Passes above codegen ask a backend what it can do
(its capabilities) and never import a renderer themselves."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from kiln.ir.kernel import Kernel


@dataclass(frozen=True)
class Backend:
    name: str
    language: str
    render: Callable[[Kernel], str]
    # (kernels, sources) -> (launchers, number found in the cache)
    build: Callable[[list[Kernel], list[str]], tuple[list[Callable], int]]
    # launchers take raw addresses (C++) or tensors (Triton); a tensor launcher checks the
    # tensors' alignment unless called through its `aligned` entry
    pass_pointers: bool
    row_scratch_limit: int  # longest row whose reused values a kernel may keep locally
    keep_loaded_rows: bool  # whether re-reading a row from memory costs more than keeping it
    unsupported_fns: frozenset = frozenset()  # element-wise functions left to ATen
    # a reduction running fewer programs than this is split across more (0: never); a row
    # is a program, a column reduction's program computes column_block outputs
    busy_programs: int = 0
    column_block: int = 1
    # launch-bound matmuls with a bias become mm + a fused bias add (frontend/addmm.py)
    split_small_addmm: bool = False
    # independent point-wise kernels one launch runs (ir/group.py); below 2, none are grouped
    group_members: int = 0
    # buffers one group takes at most: a C++ group's call passes each (ctypes takes 1024); a
    # Triton group is one function whose compile grows with its members' code
    group_buffers: int = 1024
    # whether a kernel joins a group only when launch-bound or when its streams walk one index
    # (passes/pipeline.py's _joins_group): a Triton member runs over a flat index, so a
    # kernel that tiles its lines (a transposing one) would lose its tiling
    group_flat_only: bool = False
    # the largest domain (points) over which kernels that share no buffer merge (None: any).
    # On a CPU each kernel is a parallel region to enter; on a GPU a merged kernel's threads
    # hold every member's streams at once, which pays only where the launch is the cost
    merge_unrelated_points: int | None = None
    # the most buffers a kernel merged from unrelated ones moves (None: any). A small domain
    # is few programs on a GPU, and each walks all its streams one after another; unrelated
    # kernels that stay apart run side by side in a kernel group instead
    merge_unrelated_buffers: int | None = None
    # whether a math-library value read over a larger domain than its own may be stored rather
    # than recomputed, where the cost model says it pays: a CPU's math calls cost far more than
    # loads; a GPU's are nearly free, and storing would add a launch
    store_broadcast_math: bool = False
    # matmul templates with fused epilogues (passes/matmul.py): False never, True wherever
    # they apply, None where the cost model predicts they pay
    matmul_templates: bool | None = False
    # whether a matmul template's first call times cuBLAS against it (max-autotune)
    times_matmuls: bool = False
    # a matmul template's (BLOCK_M, BLOCK_N, share of the SMs its waves keep busy)
    matmul_tile: Callable | None = None
    # stack bytes a thread of a matmul template spills, compiled (None: not known)
    matmul_spills: Callable | None = None
    # what a shape family's kernel decided about its sizes (a reason kiln.explain shows)
    size_choices: Callable[[Kernel], str] | None = None


def _cpp(options) -> Backend:
    from kiln.codegen import cpp, cpp_group, cpp_reductions
    from kiln.runtime import cpp_build

    def build(kernels, sources):
        results = cpp_build.build_all([(src, k.name, (len(k.params), len(k.sizes)))
                                       for k, src in zip(kernels, sources)])
        return [r.fn for r in results], sum(r.cached for r in results)

    # on a CPU a re-read row comes from L1: keeping a plain load would only add a store
    # a reduction to a few values would run on one core: split it, a few chunks per thread
    return Backend("cpp", "C++", cpp_group.render, build, True, cpp.ROW_SCRATCH_LIMIT, False,
                   busy_programs=4 * torch.get_num_threads(), column_block=cpp_reductions.COLUMN_BLOCK,
                   group_members=64, store_broadcast_math=True, matmul_templates=options.matmul_templates)


def _triton(options) -> Backend:
    from kiln.codegen import triton_group, triton_math, triton_sizes
    from kiln.codegen import triton_launch as launch
    from kiln.codegen.templates import matmul
    from kiln.runtime import triton_build

    def build(kernels, sources):
        # tuning every kernel costs compile time: by default one heuristic configuration
        results = triton_build.build_all(list(zip(kernels, sources)), autotune=options.mode == "max-autotune")
        return [r.fn for r in results], sum(r.cached for r in results)

    unsupported = triton_math.INTERPRETER_UNSUPPORTED if triton_math.INTERPRETED else frozenset()
    # a persistent row lives in registers: keeping it is free, re-reading it is not
    return Backend("triton", "Triton", triton_group.render_source, build, False, launch.PERSISTENT_MAX, True,
                   unsupported, launch.BUSY_PROGRAMS, launch.COLUMN_BLOCK, split_small_addmm=True,
                   group_members=16, group_buffers=128, group_flat_only=True,
                   merge_unrelated_points=launch.SMALL_DOMAIN,
                   merge_unrelated_buffers=launch.SMALL_MERGE_BUFFERS,
                   matmul_templates=options.matmul_templates,
                   times_matmuls=options.mode == "max-autotune", matmul_tile=matmul.tile,
                   matmul_spills=triton_build.template_spill_bytes,
                   size_choices=triton_sizes.family_choices)


_FACTORIES = {"cpp": _cpp, "triton": _triton}


def resolve_target(target: str, device: torch.device) -> str:
    """The code generator for tensors on device: "auto" picks C++ on CPUs, Triton on GPUs."""
    if target == "auto":
        return "triton" if device.type == "cuda" else "cpp"
    return target


def get_backend(name: str, options) -> Backend:
    return _FACTORIES[name](options)


def target_problem(target: str, device: torch.device) -> str | None:
    """Why this target cannot run tensors on device, or None."""
    if target == "cpp" and device.type != "cpu":
        return f"the C++ backend runs CPU tensors only, not {device.type}"
    if target == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton on CPU tensors needs TRITON_INTERPRET=1 (Triton's interpreter)"
    if target == "triton" and device.type not in ("cpu", "cuda"):
        return f"the Triton backend does not run {device.type} tensors"
    return None

"""Triton kernels: generated source written to the cache by content hash, imported, compiled
for each launch configuration (in worker processes when there are several, see
compile_pool) and wrapped in a launcher; or, from stored binaries (triton_abi.KernelBinary),
launched through the CUDA driver without Triton (launchers_from_binaries)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln import counters, logs
from kiln.ir.kernel import Kernel
from kiln.ir.matmul import is_matmul
from kiln.runtime import cache, compile_pool, triton_abi
from kiln.runtime.autotune import Config, TunedLauncher
from kiln.runtime.triton_abi import KernelBinary


@dataclass
class TritonBuild:
    fn: Callable
    cached: bool


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def versions() -> dict[str, str]:
    """The key components of a Triton kernel beyond its source."""
    parts = {"triton version": triton_abi.installed_version(), "triton interpreter": str(interpreted())}
    try:
        import torch

        if torch.cuda.is_available() and not interpreted():
            parts.update({
                "cuda version": torch.version.cuda or "",
                "device": torch.cuda.get_device_name(),
                "device capability": str(torch.cuda.get_device_capability()),
            })
    except Exception:  # noqa: BLE001, S110 - versions only refine the key
        pass
    return parts


def _source_entry(kernel: Kernel, source: str) -> cache.Entry:
    components = cache.key_components(kernel=kernel.name, source=cache.text_digest(source), **versions())
    return cache.entry("triton source", "triton", kernel.name, ".py", components)


def _load(kernel: Kernel, source: str):
    """The kernel's @triton.jit function, from its source in the cache (checked before import)."""
    path, cached = cache.load_or_build(_source_entry(kernel, source), lambda temp: temp.write_text(source))
    return getattr(compile_pool.load_module(str(path)), kernel.name), path, cached


def _interpreted_launcher(kernel: Kernel, jit_fn) -> Callable:
    if kernel.sizes:  # a shape family's: its grid is computed per call
        from kiln.runtime.triton_family import interpreted_launcher

        return interpreted_launcher(kernel, jit_fn)
    config = launch_configs(kernel, False, True)[0]
    launcher = jit_fn[launch_grid(kernel, config)]
    kwargs = jit_kwargs(kernel, config)

    def launch(*tensors):
        launcher(*tensors, **kwargs)

    launch.__name__ = kernel.name
    launch.aligned = launch  # the interpreter needs no alignment
    return launch


def launch_configs(kernel: Kernel, autotune: bool, interpreted: bool = False) -> list[tuple]:
    """The heuristic's launch configuration, or with autotune every candidate; a matmul
    template's (codegen/templates/matmul.py) are its tiles, warps and stages."""
    if is_matmul(kernel):
        from kiln.codegen.templates import matmul

        if interpreted:
            return [matmul.launch_config(kernel, True)]
        return matmul.candidate_configs(kernel) if autotune else [matmul.launch_config(kernel, False)]
    from kiln.codegen.triton_launch import candidate_configs, launch_config

    if kernel.sizes:  # a family's: the traced sizes' variant (timings hold for one shape)
        from kiln.codegen.triton_sizes import launch_variants

        return [launch_variants(kernel, interpreted)[0][0]]
    if interpreted:
        return [launch_config(kernel, True)]
    return candidate_configs(kernel) if autotune else [launch_config(kernel, False)]


def launch_grid(kernel: Kernel, config: tuple) -> tuple[int, int, int]:
    if is_matmul(kernel):
        from kiln.codegen.templates import matmul

        return matmul.grid(kernel, config)
    from kiln.codegen.triton_launch import grid

    return grid(kernel, config)


def constexprs(kernel: Kernel, config: tuple) -> dict:
    """The values of the kernel's constexpr parameters, in their order."""
    if is_matmul(kernel):
        from kiln.codegen.templates import matmul

        return matmul.constexprs(config)
    from kiln.codegen.triton_launch import assumes_aligned_tensors

    values = {"XBLOCK": config[0], "RBLOCK": config[1], "ALIGNED": assumes_aligned_tensors(kernel)}
    if len(config) > 3:  # a family's kernel with a one-tile body (triton_sizes.launch_variants)
        values["ONE_TILE"] = config[3]
    return values


def _compile_options(kernel: Kernel, config: tuple) -> dict:
    if is_matmul(kernel):
        from kiln.codegen.templates import matmul

        return matmul.options(config)
    return {"num_warps": config[2]}


def jit_kwargs(kernel: Kernel, config: tuple) -> dict:
    """What Triton's JIT takes for one launch configuration of the kernel, on tensors whose
    alignment the compiled binaries do not assume (and in the interpreter)."""
    kwargs = {**constexprs(kernel, config), **_compile_options(kernel, config)}
    if "ALIGNED" in kwargs:
        kwargs["ALIGNED"] = False
    return kwargs


def build_all(jobs: list[tuple[Kernel, str]], autotune: bool = False) -> list[TritonBuild]:
    """Load every kernel; on a GPU, compile its launch configurations for this GPU. With
    several candidates the first launch picks the fastest."""
    loaded = [_load(kernel, source) for kernel, source in jobs]
    if interpreted() or not jobs:
        return [
            TritonBuild(_interpreted_launcher(kernel, fn), cached)
            for (kernel, _), (fn, _, cached) in zip(jobs, loaded)
        ]
    from kiln.codegen.triton_launch import assumes_aligned_tensors

    kernels = [(kernel, path) for (kernel, _), (_, path, _) in zip(jobs, loaded)]
    all_variants = compile_variants(kernels, triton_abi.current_target(), autotune)
    if autotune:
        _add_cublas_candidates([kernel for kernel, _ in kernels], all_variants)
    builds = []
    for (kernel, path), (jit_fn, _, cached), variants in zip(kernels, loaded, all_variants):
        if kernel.sizes:
            builds.append(TritonBuild(_family_launcher(kernel, path, jit_fn, variants), cached))
            continue
        launcher = TunedLauncher(
            kernel.name,
            functools.partial(launch_grid, kernel),
            jit_fn,
            variants,
            path.with_suffix(".tune.json"),
            len(kernel.params),
            assumes_aligned_tensors(kernel),
            functools.partial(jit_kwargs, kernel),
            functools.partial(constexprs, kernel),
        )
        builds.append(TritonBuild(launcher, cached))
    return builds


def _add_cublas_candidates(kernels: list[Kernel], all_variants: list[dict]) -> None:
    """max-autotune: a matmul template that asks for it also times cuBLAS with its epilogue as
    a kernel of its own (runtime/matmul_candidates.py), built here beside it."""
    from kiln.codegen.triton import render_source
    from kiln.ir.matmul import epilogue_kernel
    from kiln.runtime.matmul_candidates import CUBLAS, cublas_launch

    wanted = [(kernel, variants) for kernel, variants in zip(kernels, all_variants)
              if is_matmul(kernel) and kernel.cublas_candidate]
    if not wanted:
        return
    epilogues = [epilogue_kernel(kernel) for kernel, _ in wanted]
    built = build_all([(e, render_source(e)) for e in epilogues], autotune=False)
    for (kernel, variants), epilogue in zip(wanted, built):
        variants[CUBLAS] = cublas_launch(kernel, epilogue.fn)


def compile_variants(kernels: list[tuple[Kernel, Path]], target: tuple, autotune: bool = False) -> list[dict]:
    """Per kernel (loaded from path), {config: CompiledKernel} for target's (backend, arch,
    warp_size): the heuristic's launch configuration, or with autotune every candidate.
    A family's kernel (with sizes) gets its heuristic configuration's binaries for the
    variants runtime/triton_family.py compiles with the graph, keyed by variant."""
    from kiln.runtime.triton_family import compiled_with_the_graph

    configs = [
        compiled_with_the_graph(kernel) if kernel.sizes else launch_configs(kernel, autotune)
        for kernel, _ in kernels
    ]
    # (kernel, path, key, launch configuration) per binary: a family's keys name variants
    planned = [(kernel, path, c, _family_config(kernel, c) if kernel.sizes else c)
               for (kernel, path), cs in zip(kernels, configs) for c in cs]
    jobs = [family_compile_args(kernel, path, target, c, config) if kernel.sizes
            else compile_args(kernel, path, c, target) for kernel, path, c, config in planned]
    fills = [_fills_the_gpu(kernel, config) for kernel, _, _, config in planned]
    compiled = iter(_compile_at_register_budgets(jobs, fills))
    return [{c: next(compiled) for c in cs} for cs in configs]


# An H100's or H200's multiprocessors: a launch of no more programs than this runs at most one
# on each, however many its registers would let one hold.
MULTIPROCESSORS = 132


def _fills_the_gpu(kernel: Kernel, config: tuple) -> bool:
    """Whether a launch at the traced sizes has more programs than the GPU multiprocessors:
    only then can a register budget that fits more programs on one speed it up."""
    from kiln.codegen.triton_sizes import hinted

    return math.prod(hinted(kernel, d) for d in launch_grid(kernel, config)) > MULTIPROCESSORS


def _family_launcher(kernel: Kernel, path: Path, jit_fn, binaries: dict) -> Callable:
    """A family's kernel launched at any of its sizes (runtime/triton_family.py); a variant
    not compiled with the graph compiles at the first launch that needs it."""
    from kiln.codegen.triton_launch import assumes_aligned_tensors
    from kiln.runtime.triton_family import FamilyLauncher

    target = triton_abi.current_target()

    def compile_variant(key, config):
        start = time.perf_counter()
        binary = _compile_at_register_budgets([family_compile_args(kernel, path, target, key, config)])[0]
        seconds = time.perf_counter() - start
        counters.binary_at_launch(seconds)
        logs.recompiles.info("%s: binary %s (configuration %d, int64 indices %s, vector sizes %s) "
                             "compiled at its first launch, %.2f s", kernel.name, config, *key, seconds)
        return binary

    # a binary for vector sizes may assume aligned tensors where the others do not
    return FamilyLauncher(kernel, jit_fn, compile_variant, binaries, assumes_aligned_tensors(kernel, True))


def family_compile_args(kernel: Kernel, path: Path, target: tuple, key: tuple,
                        config: tuple | None = None) -> compile_pool.CompileArgs:
    """compile_args for one binary of a family's kernel (runtime/triton_family.VariantKey).
    A launcher passes the configuration it chose at build time: outside the compile the
    sizes' traced values, which launch_variants reads, are gone."""
    config = config or _family_config(kernel, key)
    return compile_args(kernel, path, config, target, key[1], key[2])


def _family_config(kernel: Kernel, key: tuple) -> tuple:
    """The launch configuration of a family's binary (runtime/triton_family.VariantKey)."""
    from kiln.codegen.triton_sizes import launch_variants

    return launch_variants(kernel, False)[0][key[0]]


# An SM holds 65536 registers and 2048 threads (in at most 32 programs) and gives a warp its
# registers in units of 256, 8 a thread: a kernel of 74 registers a thread takes as many as
# one of 80, and 6 programs of 4 warps fit on an SM where 7 of 72 would. ptxas weighs neither
# way of that step: it does not drop a few registers to fit another program, and given no
# limit it schedules for fewer registers than the programs that fit would allow, spreading
# loads between the arithmetic that it could have issued together. So a CUDA kernel whose
# count is not its budget compiles again with the budget as .maxnreg: the unit boundary below
# its count where that fits another program (kept if it does not spill), else the most
# registers at which as many programs fit. The latter only from 32 registers up: most of a
# training step's kernels are small element-wise ones, whose second compile lengthens the
# first step and speeds up none (docs/benchmarks.md, register budgets).
REGISTERS_PER_SM, THREADS_PER_SM, PROGRAMS_PER_SM, REGISTER_UNIT, MAX_REGISTERS = 65536, 2048, 32, 8, 255
MIN_REGISTERS_RAISED = 32


def programs_per_sm(registers: int, warps: int) -> int:
    per_warp = max(1, -(-registers // REGISTER_UNIT)) * REGISTER_UNIT * 32
    return min(PROGRAMS_PER_SM, THREADS_PER_SM // (32 * warps), REGISTERS_PER_SM // (per_warp * warps))


def register_caps(registers: int, warps: int) -> list[int]:
    """The register budgets to try, in turn, for a kernel that uses `registers` a thread:
    the unit boundary below, where that fits more programs on an SM; the most registers at
    which as many programs fit, where that is more (from MIN_REGISTERS_RAISED up)."""
    caps = []
    below = registers // REGISTER_UNIT * REGISTER_UNIT
    fewer_fit = programs_per_sm(below, warps) > programs_per_sm(registers, warps)
    if REGISTER_UNIT <= below < registers and fewer_fit:
        caps.append(below)
    fits, top = programs_per_sm(registers, warps), below
    while top + REGISTER_UNIT <= MAX_REGISTERS and programs_per_sm(top + REGISTER_UNIT, warps) == fits:
        top += REGISTER_UNIT
    return caps + [top] if top > registers >= MIN_REGISTERS_RAISED else caps


def _resources(compiled) -> tuple[int, int] | None:
    """(registers a thread, stack bytes) of a compiled CUDA kernel, read from its cubin's
    .nv.info section (attribute records: format, attribute, then a 16-bit value or a sized
    payload; REGCOUNT and MAX_STACK_SIZE hold a symbol index and the value). None if absent."""
    import struct

    cubin = compiled.asm["cubin"]
    values = {}
    try:  # ELF64: section headers from e_shoff (0x28); their size, count and names' index at 0x3A
        (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
        sections = [struct.unpack_from("<I20xQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
        names = sections[shstrndx][1]
        for name, offset, size in sections:
            if cubin[names + name : cubin.index(b"\0", names + name)] != b".nv.info":
                continue
            at = offset
            while at < offset + size:
                fmt, attribute, length = struct.unpack_from("<BBH", cubin, at)
                if fmt == 4 and attribute in (0x2F, 0x12):  # EIATTR_REGCOUNT, EIATTR_MAX_STACK_SIZE
                    values[attribute] = struct.unpack_from("<I", cubin, at + 8)[0]
                at += 4 + (length if fmt == 4 else 0)
    except (struct.error, ValueError, IndexError):
        return None
    return (values[0x2F], values.get(0x12, 0)) if 0x2F in values else None


def _compile_at_register_budgets(jobs: list[compile_pool.CompileArgs],
                                 fills: list[bool] | None = None) -> list:
    """Compile every job; for CUDA, again under its register budgets in turn, keeping the
    first binary that does not spill more than the uncapped one. fills: per job, whether its
    launches fill the GPU (_fills_the_gpu); those that do not compile once."""
    compiled = compile_pool.compile_all(jobs)
    pending = []  # (job index, budgets left to try, stack bytes uncapped)
    for i, (job, binary) in enumerate(zip(jobs, compiled)):
        if fills is not None and not fills[i]:
            continue
        # a matmul template's registers follow from its tiles, which autotuning chooses
        template = "num_stages" in job.options
        used = _resources(binary) if job.target[0] == "cuda" and not template else None
        if used and (caps := register_caps(used[0], job.options["num_warps"])):
            pending.append((i, caps, used[1]))
    while pending:
        tries = [
            dataclasses.replace(jobs[i], options={**jobs[i].options, "maxnreg": caps[0]})
            for i, caps, _ in pending
        ]
        spilled = []
        for (i, caps, stack), binary in zip(pending, compile_pool.compile_all(tries)):
            used = _resources(binary)
            if used and used[1] <= stack:
                compiled[i] = binary
            elif caps[1:]:
                spilled.append((i, caps[1:], stack))
        pending = spilled
    return compiled


_POINTER_TYPE = {
    "float32": "*fp32",
    "float64": "*fp64",
    "bfloat16": "*bf16",
    "float16": "*fp16",
    "int64": "*i64",
    "int32": "*i32",
    "int16": "*i16",
    "int8": "*i8",
    "uint8": "*u8",
    "bool": "*u1",
}


def _options(compile_options: dict) -> dict:
    """Compile options, with the debug settings Triton's JIT would add from the environment.
    No fp fusion: eager rounds every op's result, so a*b - c must not become one fma (where c
    is a*b's own rounded value, x - mean over one element, the fma leaves the rounding error);
    the math helpers that want fma ask for it (tl.fma)."""
    from triton import knobs

    return {
        **compile_options,
        "debug": bool(knobs.runtime.debug),
        "enable_fp_fusion": False,
        "instrumentation_mode": knobs.compilation.instrumentation_mode,
    }


def compile_args(kernel: Kernel, path: Path, config: tuple, target: tuple, wide: bool = False,
                 vector_sizes: bool = False, any_alignment: bool = False) -> compile_pool.CompileArgs:
    """triton.compile's arguments for one launch configuration of a kernel, specialized as
    the JIT specializes tensors that are all 16-byte aligned (the direct launch's condition),
    unless the kernel's rows are not (see below) or any_alignment asks for a binary that
    takes tensors at any address. A family's kernel takes its sizes as int32 (int64 when
    wide: WIDE makes its indices int64 too), each assumed a multiple of the kernel's vector
    with vector_sizes, as the JIT specializes multiples of 16 (runtime/triton_family.py chooses
    per launch)."""
    constants = constexprs(kernel, config)
    signature = {p.name: _POINTER_TYPE[str(p.dtype).replace("torch.", "")] for p in kernel.params}
    signature.update({f"ks{i}": "i64" if wide else "i32" for i in range(len(kernel.sizes))})
    signature.update({name: "constexpr" for name in constants})
    from kiln.codegen.triton_launch import assumes_aligned_tensors
    from kiln.codegen.triton_sizes import size_vector

    aligned = assumes_aligned_tensors(kernel, vector_sizes) and not any_alignment
    attrs = {(i,): triton_abi.aligned_attr(target) for i in range(len(kernel.params))} if aligned else {}
    if vector_sizes:
        first, multiple = len(kernel.params), triton_abi.multiple_attr(target, size_vector(kernel))
        attrs.update({(first + i,): multiple for i in range(len(kernel.sizes))})
    if "ALIGNED" in constants:
        constants["ALIGNED"] = aligned
    if kernel.sizes:
        signature["WIDE"] = "constexpr"
        constants["WIDE"] = wide
    return compile_pool.CompileArgs(
        str(path), kernel.name, signature, constants, attrs, tuple(target),
        _options(_compile_options(kernel, config))
    )


def compile_for_target(kernel: Kernel, source: str, arch: int = 90, warp_size: int = 32):
    """Compile a generated kernel for a CUDA architecture without a GPU (ahead of time)."""
    _, path, _ = _load(kernel, source)
    return _compile_at_register_budgets(
        [compile_args(kernel, path, launch_configs(kernel, False)[0], ("cuda", arch, warp_size))]
    )[0]


_SPILLS: dict[str, int | None] = {}


def template_spill_bytes(kernel: Kernel, target: tuple | None = None) -> int | None:
    """Stack bytes a thread of a matmul template spills at the heuristic's configuration,
    compiled for target (this process's GPU by default); None where nothing is compiled
    (Triton's interpreter). Layers of one model share a template's text: compiled once."""
    from kiln.codegen.triton_group import render_source

    if interpreted():
        return None
    target = tuple(target or triton_abi.current_target())
    probe = dataclasses.replace(kernel, name="kiln_template_probe")
    source = render_source(probe)
    key = f"{target}:{source}"
    if key not in _SPILLS:
        _, path, _ = _load(probe, source)
        config = launch_configs(probe, False)[0]
        binary = _compile_at_register_budgets([compile_args(probe, path, config, target)])[0]
        used = _resources(binary)
        _SPILLS[key] = used[1] if used else None
    return _SPILLS[key]


def binaries_of(variants: dict[Config, object], grid: Callable[[Config], tuple], name: str) -> list | str:
    """Each configuration's CompiledKernel as a KernelBinary, or why one cannot be stored."""
    binaries = []
    for config, compiled in variants.items():
        if not hasattr(compiled, "asm"):  # a launcher of its own (max-autotune's cuBLAS candidate)
            return f"{name} has a candidate that is not a Triton binary ({config[0]})"
        used = _resources(compiled)
        binary = triton_abi.binary_of(compiled, config, grid(config), used[0] if used else None)
        if isinstance(binary, str):
            return f"{name} {binary}"
        binaries.append(binary)
    return binaries


def any_alignment_binaries(jobs: list[tuple[Kernel, str, Config]],
                           target: tuple) -> list[KernelBinary | None]:
    """Per (kernel, source, configuration), its binary compiled for tensors at any address
    (what an artifact launches when a caller's tensor is off a 16-byte boundary), compiled
    together (in parallel); None where the kernel's binaries take any address already."""
    from kiln.codegen.triton_launch import assumes_aligned_tensors

    wanted = [(kernel, source, config) for kernel, source, config in jobs if assumes_aligned_tensors(kernel)]
    args = [compile_args(kernel, _load(kernel, source)[1], config, target, any_alignment=True)
            for kernel, source, config in wanted]
    compiled = {kernel.name: c for (kernel, _, _), c in zip(wanted, _compile_at_register_budgets(args))}
    out = []
    for kernel, _, config in jobs:
        binary = None
        if kernel.name in compiled:
            found = binaries_of({config: compiled[kernel.name]}, functools.partial(launch_grid, kernel),
                                kernel.name)
            binary = found[0] if isinstance(found, list) else None
        out.append(binary)
    return out


def _jit_function(kernel: Kernel, source: str):
    return _load(kernel, source)[0]


def launchers_from_binaries(kernels: list[Kernel], sources: list[str],
                            binaries: list[list[KernelBinary]]) -> list[TunedLauncher]:
    """Launchers over stored binaries, loaded through the CUDA driver: no Triton compile. A
    kernel's source is imported (and JIT-compiled by Triton) only for tensors off 16-byte
    boundaries; several configurations are tuned as compiled ones are, under the same record."""
    from kiln.runtime.cuda_driver import BinaryLauncher

    launchers = []
    for kernel, source, stored in zip(kernels, sources, binaries):
        record = _source_entry(kernel, source).path.with_suffix(".tune.json")
        load_jit = functools.partial(_jit_function, kernel, source)
        variants = {b.config: b for b in stored}
        launchers.append(BinaryLauncher(kernel.name, variants, record, load_jit=load_jit,
                                        jit_kwargs=functools.partial(jit_kwargs, kernel)))
    return launchers

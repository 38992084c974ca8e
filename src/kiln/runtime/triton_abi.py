"""Triton's conventions, in one file: what a compiled kernel's metadata holds, how its
launch passes arguments, and the few Triton calls kiln's builds make. A new Triton release
that changes any of them is a change to this file only.

A compiled kernel leaves Triton as a `KernelBinary`: the cubin and what launching it needs.
Loading and launching a binary (runtime/cuda_driver.py) then needs no Triton at all.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from dataclasses import asdict, dataclass, field
from typing import Any

# The Triton releases whose launch convention this file describes: a kernel's parameters in
# signature order with constexprs left out, then a global scratch pointer and a profile
# scratch pointer (null when their sizes are 0); a program of 32 * num_warps threads.
SUPPORTED = ("3.5", "3.6")
EXTRA_POINTERS = ("global scratch", "profile scratch")


@dataclass(frozen=True)
class KernelBinary:
    """One launch configuration of a compiled kernel: the cubin and its launch metadata."""

    name: str  # the function's name in the cubin
    cubin: bytes = field(repr=False)
    arch: int  # the CUDA compute capability it was compiled for, 90 for sm_90
    warp_size: int
    num_warps: int
    num_ctas: int
    shared: int  # dynamic shared memory bytes
    global_scratch_size: int  # bytes a program, allocated per launch when not 0
    global_scratch_align: int
    profile_scratch_size: int
    profile_scratch_align: int
    signature: dict[str, str]  # parameter -> Triton type ("*fp32", "constexpr")
    constants: dict[str, Any]  # constexpr -> its value
    config: tuple[int, int, int]  # XBLOCK, RBLOCK, num_warps
    grid: tuple[int, int, int]
    aligned: bool  # compiled for 16-byte aligned pointers
    registers: int | None = None  # a thread's registers, where the cubin says
    maxnreg: int | None = None  # the register budget it was compiled under, if any
    triton_version: str = ""

    @functools.cached_property
    def pointers(self) -> int:
        """The kernel's own parameters that a launch passes (constexprs are compiled in)."""
        return sum(1 for t in self.signature.values() if t != "constexpr")

    @property
    def threads(self) -> int:
        return self.num_warps * self.warp_size

    @property
    def cubin_sha256(self) -> str:
        return hashlib.sha256(self.cubin).hexdigest()

    def to_dict(self) -> dict:
        """JSON-compatible; the cubin is named by its digest (it travels as its own file)."""
        data = asdict(self)
        del data["cubin"]
        data.update(config=list(self.config), grid=list(self.grid), cubin_sha256=self.cubin_sha256)
        return data

    @classmethod
    def from_dict(cls, data: dict, cubin: bytes) -> KernelBinary:
        """The binary of to_dict's data and its cubin; raises ValueError if the cubin is not
        the one the data names."""
        if hashlib.sha256(cubin).hexdigest() != data["cubin_sha256"]:
            raise ValueError(f"the cubin of {data['name']} does not match its digest")
        fields = {k: v for k, v in data.items() if k != "cubin_sha256"}
        fields.update(config=tuple(data["config"]), grid=tuple(data["grid"]))
        return cls(cubin=cubin, **fields)


def binary_of(
    compiled, config: tuple[int, int, int], grid: tuple[int, int, int], registers: int | None = None
) -> KernelBinary | str:
    """A Triton CompiledKernel as a KernelBinary, or why it cannot be launched without
    Triton (a launch attribute kiln's loader does not set)."""
    meta = compiled.metadata
    target = meta.target
    if target.backend != "cuda":
        return f"compiled for {target.backend}, not CUDA"
    if getattr(meta, "tensordesc_meta", None):
        return "uses tensor descriptors"
    if meta.num_ctas != 1 or tuple(getattr(meta, "cluster_dims", (1, 1, 1))) != (1, 1, 1):
        return f"runs in clusters of {meta.num_ctas} programs"
    if meta.launch_cooperative_grid or meta.launch_pdl:
        return "needs a cooperative or programmatic-dependent launch"
    signature = {str(k): str(v) for k, v in compiled.src.signature.items()}
    names = list(compiled.src.signature)
    constants = {
        names[k[0]] if isinstance(k, tuple) else str(k): v for k, v in compiled.src.constants.items()
    }
    return KernelBinary(
        name=meta.name,
        cubin=bytes(compiled.asm["cubin"]),
        arch=int(target.arch),
        warp_size=int(target.warp_size),
        num_warps=meta.num_warps,
        num_ctas=meta.num_ctas,
        shared=meta.shared,
        global_scratch_size=meta.global_scratch_size,
        global_scratch_align=meta.global_scratch_align,
        profile_scratch_size=meta.profile_scratch_size,
        profile_scratch_align=meta.profile_scratch_align,
        signature=signature,
        constants=constants,
        config=tuple(config),
        grid=tuple(grid),
        aligned=bool(compiled.src.attrs),
        registers=registers,
        maxnreg=meta.maxnreg,
        triton_version=meta.triton_version,
    )


def scratch_sizes(binary: KernelBinary) -> tuple[int, int]:
    """Bytes of global and profile scratch memory one launch needs (0: a null pointer)."""
    programs = binary.grid[0] * binary.grid[1] * binary.grid[2] * binary.num_ctas
    return programs * binary.global_scratch_size, programs * binary.profile_scratch_size


def launch_arguments(
    binary: KernelBinary, pointers: list[int], global_scratch: int = 0, profile_scratch: int = 0
) -> list[int]:
    """The values of a launch's parameters, in the compiled kernel's order: its pointers,
    then the scratch pointers Triton's code generator appends."""
    if len(pointers) != binary.pointers:
        raise ValueError(f"{binary.name} takes {binary.pointers} pointers, got {len(pointers)}")
    return [*pointers, global_scratch, profile_scratch]


def installed_version() -> str:
    """Triton's version without importing it (importing triton imports its compiler)."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        import triton

        return triton.__version__


def current_target() -> tuple:
    """(backend, arch, warp_size) of the active GPU, as Triton's driver reports it."""
    from triton.runtime import driver

    target = driver.active.get_current_target()
    return target.backend, target.arch, target.warp_size


@functools.cache
def aligned_attr(target: tuple) -> list:
    """The attribute Triton's JIT gives a pointer whose address is a multiple of 16."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    return make_backend(GPUTarget(*target)).parse_attr("D")

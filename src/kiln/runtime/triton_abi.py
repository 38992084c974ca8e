"""Triton's internals, in one file: what a compiled kernel's metadata holds, how its launch
passes arguments, the target and attributes builds ask Triton for, and the launch through
Triton's own launcher that a cold start uses. A new Triton release that changes any of them
is a change to this file (triton.compile itself, public API, runs in compile_pool).

A compiled kernel leaves Triton as a `KernelBinary`: the cubin and what launching it needs.
Loading and launching a binary (runtime/cuda_driver.py) then needs no Triton at all.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

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


@functools.cache
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


def multiple_attr(target: tuple, multiple: int) -> list:
    """The attribute of an int argument that is a multiple of `multiple` (a power of two): the
    JIT's for multiples of 16, with the divisor changed."""
    return [[name, multiple] if name == "tt.divisibility" else [name, value]
            for name, value in aligned_attr(target)]


# ---- launching a CompiledKernel through Triton's own launcher (a cold start) ----------


# Triton builds a C launcher per kernel signature: a C compiler run when its cache is cold.
# kiln's kernels take nothing but pointers, and the GPU reads only as many parameters
# as a kernel declares, so one launcher built for up to 8, 16, 32... pointers serves every
# kernel with as many or fewer, given None (a null pointer) for the rest: the null scratch
# pointers a kernel without scratch memory would get anyway.
_SHARED_LAUNCHERS: dict[tuple, object] = {}


def shared_launcher(n_pointers: int, metadata) -> tuple[object, int] | None:
    """The launcher for kernels of up to n_pointers pointers (rounded up) and its width, or
    None when the kernel needs what only its own launcher passes (scratch memory)."""
    if (
        metadata.global_scratch_size
        or metadata.profile_scratch_size
        or getattr(metadata, "tensordesc_meta", None)
    ):
        return None
    width = max(8, 1 << (n_pointers - 1).bit_length())
    key = (width, metadata.num_ctas, metadata.launch_cooperative_grid, metadata.launch_pdl)
    if key not in _SHARED_LAUNCHERS:
        from triton.runtime.driver import driver

        signature = SimpleNamespace(constants={}, signature={i: "*i8" for i in range(width)})
        _SHARED_LAUNCHERS[key] = driver.active.launcher_cls(signature, metadata)
    return _SHARED_LAUNCHERS[key], width


def load_function(compiled):
    """The compiled kernel loaded on the current GPU (Triton's own loading would also build
    the kernel's launcher)."""
    from triton.runtime.driver import driver

    device = driver.active.get_current_device()
    meta = compiled.metadata
    if meta.shared > driver.active.utils.get_device_properties(device)["max_shared_mem"]:
        raise RuntimeError(
            f"kiln: {compiled.name} needs {meta.shared} bytes of shared memory, more than the GPU has"
        )
    _, function, _, _, max_threads = driver.active.utils.load_binary(
        compiled.name, compiled.kernel, meta.shared, device
    )
    if meta.num_warps * 32 > max_threads:
        raise RuntimeError(
            f"kiln: {compiled.name} needs {meta.num_warps * 32} threads, more than it can have"
        )
    return function


def own_launch(compiled, constants: tuple) -> Callable:
    """A compiled binary's launch through its own C launcher (which takes int arguments too),
    the grid given per call: launch(grid, args) passes the kernel's arguments, then its
    constexprs' values in the signature's order, as the binary was compiled with them."""
    compiled._init_handles()
    device = torch.cuda.current_device()
    current_stream = torch._C._cuda_getCurrentRawStream
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata

    def launch(grid, args):
        run(grid[0], grid[1], grid[2], current_stream(device), function, metadata, None, None, None,
            *args, *constants)

    return launch


def direct_launch(
    compiled, grid: tuple[int, int, int], config: tuple, n_pointers: int, constants: tuple = ()
) -> Callable:
    """Call the C launch function with everything fixed ahead: per launch, only the current
    stream is looked up (a fraction of Triton's generic launch path). constants: the
    constexprs' values in signature order (default XBLOCK, RBLOCK)."""
    device = torch.cuda.current_device()
    current_stream = torch._C._cuda_getCurrentRawStream
    g0, g1, g2 = grid
    shared = shared_launcher(n_pointers, compiled.metadata)
    if shared is None:
        own = own_launch(compiled, constants or tuple(config[:2]))
        return lambda *args: own(grid, args)
    launcher, width = shared
    c_launch, function, metadata = launcher.launch, load_function(compiled), compiled.packed_metadata
    cooperative, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
    padding = (None,) * (width - n_pointers)

    def launch(*args):
        c_launch(
            g0,
            g1,
            g2,
            current_stream(device),
            function,
            cooperative,
            pdl,
            None,
            None,
            metadata,
            None,
            None,
            None,
            *args,
            *padding,
        )

    return launch

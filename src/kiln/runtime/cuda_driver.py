"""Compiled GPU kernels (triton_abi.KernelBinary) loaded and launched through the CUDA
driver, by ctypes: what a warm start from the graph cache and a loaded artifact need, with
no Triton import and no compile.

A module is loaded into the device's primary context, the one PyTorch's CUDA runtime uses,
so launches share PyTorch's streams and memory.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch

from kiln.runtime.autotune import Config, TunedLauncher
from kiln.runtime.triton_abi import EXTRA_POINTERS, KernelBinary, launch_arguments, scratch_sizes

# CUfunction_attribute and CUdevice_attribute values (cuda.h)
_FUNC_MAX_THREADS_PER_BLOCK = 0
_FUNC_SHARED_SIZE_BYTES = 1
_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_DEVICE_MAX_SHARED_PER_BLOCK_OPTIN = 97
_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT
# Above this much dynamic shared memory a function must opt in (cuFuncSetAttribute).
_DEFAULT_SHARED_LIMIT = 48 * 1024


LIBRARY = "libcuda.so.1"


class CudaUnavailable(RuntimeError):
    """No CUDA driver or GPU to run compiled kernels on."""


_p, _i, _u = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
_SIGNATURES = {
    "cuGetErrorName": [_i, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGet": [ctypes.POINTER(_i), _i],
    "cuDeviceGetAttribute": [ctypes.POINTER(_i), _i, _i],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_p), _i],
    "cuCtxGetCurrent": [ctypes.POINTER(_p)],
    "cuCtxSetCurrent": [_p],
    "cuModuleLoadData": [ctypes.POINTER(_p), _p],
    "cuModuleGetFunction": [ctypes.POINTER(_p), _p, ctypes.c_char_p],
    "cuFuncGetAttribute": [ctypes.POINTER(_i), _i, _p],
    "cuFuncSetAttribute": [_p, _i, _i],
    "cuLaunchKernel": [_p, _u, _u, _u, _u, _u, _u, _u, _p, _p, _p],
}


@functools.cache
def _driver() -> ctypes.PyDLL:
    if not torch.cuda.is_available():
        raise CudaUnavailable("no CUDA GPU is visible to PyTorch on this machine")
    torch.cuda.init()  # the runtime creates the primary contexts kiln loads modules into
    try:
        # PyDLL: calls keep the GIL, so no other thread rewrites a launcher's parameter block
        # while the driver reads it
        lib = ctypes.PyDLL(LIBRARY)
    except OSError as e:
        raise CudaUnavailable(f"the CUDA driver library cannot be loaded ({e})") from e
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, _i
    return lib


def _check(result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"kiln: {what} failed: {(name.value or b'CUDA error').decode()} ({result})")


@functools.cache
def _primary_context(device: int) -> int:
    lib, handle, ctx = _driver(), _i(), _p()
    _check(lib.cuDeviceGet(ctypes.byref(handle), device), "cuDeviceGet")
    _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), handle), "cuDevicePrimaryCtxRetain")
    return ctx.value


def _device_attribute(device: int, attribute: int) -> int:
    value, handle = _i(), _i()
    _check(_driver().cuDeviceGet(ctypes.byref(handle), device), "cuDeviceGet")
    _check(_driver().cuDeviceGetAttribute(ctypes.byref(value), attribute, handle), "cuDeviceGetAttribute")
    return value.value


def load_function(binary: KernelBinary, device: int) -> int:
    """The binary's kernel loaded on a device (a CUfunction), allowed the shared memory it needs."""
    lib = _driver()
    capability = torch.cuda.get_device_capability(device)
    if capability[0] * 10 + capability[1] != binary.arch:
        raise RuntimeError(
            f"kiln: {binary.name} was compiled for sm_{binary.arch}; GPU {device} is "
            f"sm_{capability[0]}{capability[1]}"
        )
    context, current = _primary_context(device), _p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    if current.value != context:
        _check(lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    try:
        module, function = _p(), _p()
        _check(lib.cuModuleLoadData(ctypes.byref(module), binary.cubin), f"loading {binary.name}'s cubin")
        _check(
            lib.cuModuleGetFunction(ctypes.byref(function), module, binary.name.encode()),
            f"finding {binary.name} in its cubin",
        )
        value = _i()
        _check(
            lib.cuFuncGetAttribute(ctypes.byref(value), _FUNC_MAX_THREADS_PER_BLOCK, function),
            "cuFuncGetAttribute",
        )
        if binary.threads > value.value:
            raise RuntimeError(f"kiln: {binary.name} needs {binary.threads} threads, more than it can have")
        if binary.shared > _DEFAULT_SHARED_LIMIT:
            optin = _device_attribute(device, _DEVICE_MAX_SHARED_PER_BLOCK_OPTIN)
            _check(
                lib.cuFuncGetAttribute(ctypes.byref(value), _FUNC_SHARED_SIZE_BYTES, function),
                "cuFuncGetAttribute",
            )
            if binary.shared > optin - value.value:
                raise RuntimeError(
                    f"kiln: {binary.name} needs {binary.shared} bytes of shared memory, more than the GPU has"
                )
            _check(
                lib.cuFuncSetAttribute(function, _FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin - value.value),
                "cuFuncSetAttribute",
            )
    finally:
        if current.value not in (None, context):  # another context was current: it stays so
            lib.cuCtxSetCurrent(current.value)
    return function.value


def make_primary_current(device: int) -> None:
    """Make the device's primary context current on this thread (one that has not used CUDA
    through PyTorch yet has none)."""
    _check(_driver().cuCtxSetCurrent(_primary_context(device)), "cuCtxSetCurrent")


class BinaryLaunch:
    """Launches one binary on one device: its parameter block is built once, and a launch
    writes the tensors' addresses into it and calls cuLaunchKernel on the current stream."""

    def __init__(self, binary: KernelBinary, device: int):
        self.binary = binary
        self.device = device
        self.function = load_function(binary, device)
        count = binary.pointers + len(EXTRA_POINTERS)
        self._values = (ctypes.c_uint64 * count)()
        base = ctypes.addressof(self._values)
        self._params = (ctypes.c_void_p * count)(*(base + 8 * i for i in range(count)))
        self._scratch = scratch_sizes(binary)
        self._empty = 0 in binary.grid  # no program to run (the driver refuses an empty grid)
        self._launch = _driver().cuLaunchKernel
        self._stream = torch._C._cuda_getCurrentRawStream
        self.__name__ = binary.name

    def __call__(self, *tensors: torch.Tensor) -> None:
        b, pointers = self.binary, [t.data_ptr() for t in tensors]
        if self._scratch == (0, 0):
            self._values[:] = launch_arguments(b, pointers)
        else:  # scratch memory for this launch, freed after it in stream order
            held = [
                torch.empty(n, dtype=torch.uint8, device=self.device) if n else None for n in self._scratch
            ]
            self._values[:] = launch_arguments(
                b, pointers, *(t.data_ptr() if t is not None else 0 for t in held)
            )
        if self._empty:
            return
        g0, g1, g2 = b.grid
        stream = self._stream(self.device)
        args = (self.function, g0, g1, g2, b.threads, 1, 1, b.shared, stream, self._params, None)
        result = self._launch(*args)
        if result == _INVALID_CONTEXT:  # a thread without a current context: give it PyTorch's
            make_primary_current(self.device)
            result = self._launch(*args)
        if result != 0:
            _check(result, f"launching {b.name}")


class BinaryLauncher(TunedLauncher):
    """A kernel's launcher over its stored binaries, one per launch configuration, tuned as
    TunedLauncher tunes. A tensor off a 16-byte boundary, where the binaries assume
    alignment, goes to the binary compiled for any alignment, else to Triton's JIT through
    load_jit (the kernel's source), else is refused with the reason."""

    def __init__(
        self,
        name: str,
        binaries: dict[Config, KernelBinary],
        record: Path,
        unaligned: KernelBinary | None = None,
        load_jit: Callable | None = None,
        device: int | None = None,
        jit_kwargs: Callable[[Config], dict] | None = None,
    ):
        first = next(iter(binaries.values()))
        self.device = torch.cuda.current_device() if device is None else device
        self.unaligned = unaligned
        self.load_jit = load_jit
        self._unaligned_launch: BinaryLaunch | None = None
        super().__init__(
            name, lambda config: binaries[config].grid, None, binaries, record, first.pointers, first.aligned,
            jit_kwargs,
        )

    def _launch(self, config: Config) -> Callable:
        return BinaryLaunch(self.variants[config], self.device)

    def _launch_unaligned(self, tensors) -> None:
        if self.unaligned is not None:
            if self._unaligned_launch is None:
                self._unaligned_launch = BinaryLaunch(self.unaligned, self.device)
            self._unaligned_launch(*tensors)
            return
        if self.load_jit is None:
            raise RuntimeError(
                f"kiln: {self.__name__} was compiled for tensors on 16-byte boundaries and "
                "one is not; no binary for other addresses was stored with it"
            )
        if self.jit_fn is None:
            self.jit_fn = self.load_jit()
        super()._launch_unaligned(tensors)

    def binaries(self) -> list[KernelBinary]:
        return list(self.variants.values())

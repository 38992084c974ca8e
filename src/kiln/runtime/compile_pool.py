"""Triton compiles in worker processes.

Triton holds the GIL for most of a compile, so a graph's kernels compile in parallel only in
other processes. A worker runs `triton.compile` into Triton's on-disk cache; this process
then runs the same call, which finds the result there, and gets a loaded CompiledKernel.
Workers are spawned, never forked (CUDA is initialized here), and never touch CUDA: the
target is given, not queried.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import multiprocessing
import os
import sys
import threading
import types
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("kiln")

# Fewer compiles than this run here: a worker's first compile sets up Triton's CUDA backend
# again, which this process has done already, and costs more than a few kernels save. A
# compile's time grows with its kernel's source (an optimizer step's groups are large): two
# or more compiles with this much source between them go to the workers too.
MIN_POOL_JOBS = 8
MIN_POOL_SOURCE_BYTES = 64 << 10

_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


@dataclass(frozen=True)
class CompileArgs:
    """The arguments of one `triton.compile`, in a form a worker process can receive."""
    path: str  # generated source file defining the @triton.jit kernel
    kernel_name: str
    signature: dict[str, str]
    constexprs: dict[str, int]
    attrs: dict[tuple[int, ...], list]
    target: tuple  # GPUTarget fields: (backend, arch, warp_size)
    options: dict


def load_module(path: str) -> types.ModuleType:
    """Import a generated source file, once per process."""
    name = "kiln_triton_" + Path(path).stem
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return module


def compile_in_process(args: CompileArgs):
    """triton.compile here: a cache hit when a worker compiled the same arguments."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    fn = getattr(load_module(args.path), args.kernel_name)
    src = ASTSource(fn, args.signature, args.constexprs, args.attrs)
    return triton_compile(src, target=GPUTarget(*args.target), options=args.options)


_PREFIXES = ("TRITON_", "MLIR_", "LLVM_")


def triton_settings() -> dict[str, str | None]:
    """What a compile's cache hash reads from this process beyond its arguments: Triton's,
    MLIR's and LLVM's environment variables (a ptxas path, cache-invalidating flags) and the
    libdevice path, which another library in the process (Inductor) may set after the workers
    started."""
    from triton import knobs

    settings: dict[str, str | None] = {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES)}
    settings["libdevice_path"] = knobs.nvidia.libdevice_path
    return settings


_hashed_ptxas: str | None = None  # the ptxas whose version this process's Triton hashes


def _hash_the_ptxas_in_use() -> None:
    """Triton keeps ptxas's version (a part of every compile's cache key) from its first
    compile, yet runs the ptxas its settings name at each compile. When another library
    in the process names another ptxas later (Inductor names PyTorch's), a process that
    compiled before would hash the first's version and run the second: forget the kept
    version then, here and in each worker, so that both hash the ptxas they run."""
    global _hashed_ptxas
    try:
        from triton import knobs
        from triton.backends.nvidia.compiler import get_ptxas_version

        path = knobs.nvidia.ptxas.path
    except (ImportError, RuntimeError, AttributeError):  # no CUDA backend, or no ptxas
        return
    if _hashed_ptxas != path:
        get_ptxas_version.cache_clear()
        _hashed_ptxas = path


def _apply_settings(settings: dict[str, str | None]) -> None:
    from triton import knobs

    for name in [k for k in os.environ if k.startswith(_PREFIXES) and k not in settings]:
        del os.environ[name]
    os.environ.update({k: v for k, v in settings.items() if k.startswith(_PREFIXES)})
    knobs.nvidia.libdevice_path = settings.get("libdevice_path")


def _compile_in_worker(args: CompileArgs, cache_dir: str, settings: dict[str, str | None]) -> str:
    """In a worker, with the parent's Triton settings: compile into the parent's Triton cache;
    the result's cache hash."""
    from triton import knobs

    _apply_settings(settings)
    _hash_the_ptxas_in_use()
    knobs.cache.dir = cache_dir
    return compile_in_process(args).hash


def _worker_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def _main_hidden():
    """A spawned worker first re-runs the parent's __main__ script (all of it, when the
    script has no `if __name__ == "__main__"` guard); workers need none of it."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


# Run first in each worker, through the builtin `exec` (a function of this module could only be
# sent by importing it, and importing any kiln module would run kiln/__init__.py, which
# imports torch: seconds per worker). It makes `kiln` a bare package, so the worker imports
# only this module and triton_math, which need nothing but Triton.
_LIGHT_KILN = f"""
import sys, types
kiln = types.ModuleType("kiln")
kiln.__path__ = [{str(Path(__file__).resolve().parent.parent)!r}]
sys.modules.setdefault("kiln", kiln)
"""


def _submit(fn, *args) -> Future:
    """Submit to the process-wide pool, made on first use. It starts a worker per task
    while all are busy, up to one per core: a batch of n jobs gets min(n, cores)."""
    global _pool
    with _pool_lock, _main_hidden():
        if _pool is None:
            _pool = ProcessPoolExecutor(_worker_count(), mp_context=multiprocessing.get_context("spawn"),
                                        initializer=exec, initargs=(_LIGHT_KILN,))
        return _pool.submit(fn, *args)


def shutdown_pool() -> None:
    """Stop the workers (a later compile starts new ones)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


def _submit_all(jobs: list[CompileArgs]) -> list[Future]:
    """One worker compile per job, or none when the pool cannot take them."""
    from triton import knobs

    cache_dir = knobs.cache.dir  # this process's, which may not be the workers' default
    settings = triton_settings()
    try:
        return [_submit(_compile_in_worker, args, cache_dir, settings) for args in jobs]
    except Exception as e:  # noqa: BLE001 - compiles then run in this process
        log.warning("kiln: could not start Triton compile workers (%s); compiling in this process", e)
        shutdown_pool()
        return []


def _worker_hash(future: Future, args: CompileArgs) -> str | None:
    """Wait for a worker's compile: its cache hash, or None when it failed."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise
    except Exception as e:  # noqa: BLE001 - this process compiles it, and raises any real error
        log.warning("kiln: compiling Triton kernel %s in a worker failed (%s: %s); "
                    "compiling it in this process", args.kernel_name, type(e).__name__, e)
    return None


def _worth_the_workers(jobs: list[CompileArgs]) -> bool:
    if len(jobs) >= MIN_POOL_JOBS:
        return True
    if len(jobs) < 2:
        return False
    try:
        return sum(os.path.getsize(j.path) for j in jobs) >= MIN_POOL_SOURCE_BYTES
    except OSError:
        return False


def compile_all(jobs: list[CompileArgs]) -> list:
    """A CompiledKernel per job: compiled by workers when there are enough jobs to pay for
    them, and loaded here as each finishes."""
    _hash_the_ptxas_in_use()
    pending = _submit_all(jobs) if _worth_the_workers(jobs) else []
    compiled = []
    for i, args in enumerate(jobs):
        worker_hash = None
        try:
            worker_hash = _worker_hash(pending[i], args) if pending else None
        except BrokenProcessPool as e:
            log.warning("kiln: Triton compile workers stopped (%s); compiling the rest in this process", e)
            shutdown_pool()
            pending = []
        kernel = compile_in_process(args)
        if worker_hash is not None and kernel.hash != worker_hash:
            log.warning("kiln: Triton kernel %s compiled in a worker was compiled again here: the workers' "
                        "Triton settings differ from this process's", args.kernel_name)
        compiled.append(kernel)
    return compiled

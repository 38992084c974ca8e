"""Compile C++ kernels with the system compiler, in parallel, cached by content hash.

Each kernel becomes a shared library named by the hash of its source, flags, compiler and
CPU, loaded with ctypes (no torch headers: a build takes a fraction of a second). A second
process finds the library on disk and compiles nothing.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kiln.runtime.cache import atomic_write, cache_dir, compiler_version, content_hash, cpu_model

# -O3 and native vector instructions; no -ffast-math, so NaN and infinity behave as in eager.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
         "-shared", "-fPIC"]
LIBS = ["-lmvec", "-lm"]


class BuildError(Exception):
    pass


@dataclass
class BuildResult:
    fn: ctypes._CFuncPtr
    path: Path
    cached: bool


def cxx() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "g++"


def _compile(source: str, name: str, nargs: int) -> BuildResult:
    compiler = cxx()
    key = content_hash(source, " ".join(FLAGS + LIBS), compiler_version(compiler), cpu_model())
    directory = cache_dir("cpp")
    lib_path = directory / f"{name}_{key}.so"
    cached = lib_path.exists()
    if not cached:
        src_path = directory / f"{name}_{key}.cpp"
        atomic_write(src_path, source)
        fd, tmp_lib = tempfile.mkstemp(suffix=".so", dir=directory)
        os.close(fd)
        cmd = [compiler, *FLAGS, str(src_path), "-o", tmp_lib, *LIBS]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            os.unlink(tmp_lib)
            raise BuildError(f"cannot run the C++ compiler {compiler!r}: {e}") from e
        if proc.returncode != 0:
            os.unlink(tmp_lib)
            raise BuildError(f"{compiler} rejected kernel {name}:\n{proc.stderr[-2000:]}")
        os.replace(tmp_lib, lib_path)
    lib = ctypes.CDLL(str(lib_path))
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * nargs
    fn.restype = None
    return BuildResult(fn, lib_path, cached)


def build_all(jobs: list[tuple[str, str, int]]) -> list[BuildResult]:
    """jobs: (source, function name, number of pointer arguments) -> loaded functions."""
    if len(jobs) <= 1:
        return [_compile(*j) for j in jobs]
    workers = min(len(jobs), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda j: _compile(*j), jobs))

"""Compile C++ kernels with the system compiler, in parallel, cached by content hash.

The kernels of a graph are spread over one translation unit per core; each unit is a
shared library named by the hash of its source, the prelude, flags, compiler and CPU, and
is loaded with ctypes (no torch headers). The prelude is a precompiled header built once
per machine, so a unit costs little more than its kernels. A second process finds the
libraries on disk and compiles nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kiln.runtime.cache import atomic_write, cache_dir, compiler_version, content_hash, cpu_model

# -O3 and native vector instructions; no -ffast-math, so NaN and infinity behave as in eager.
# GCC's tuning for the AVX-512 Xeon we measured (-march=native: rocketlake) keeps vectors at 256
# bits; 512 made a 20-op element-wise chain 3x faster there (glibc's 16-lane exp and tanh).
# Without AVX-512 it is moot.
# -ffp-contract=off: eager rounds every product before adding it, and g++ would otherwise fuse
# a*b - c into one fma whose result differs (a*b - (a*b) is then the product's rounding error).
# Trapping math stays on: without it g++ folds float -> int -> float into trunc(), which keeps
# the sign of a zero that the integer lost.
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno",
         "-ffp-contract=off", "-fPIC"]
LIBS = ["-lmvec", "-lm"]
PRELUDE = Path(__file__).resolve().parent.parent / "codegen" / "cpp_prelude.h"


class BuildError(Exception):
    pass


@dataclass
class BuildResult:
    fn: ctypes._CFuncPtr
    path: Path
    cached: bool


def cxx() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "g++"


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"cannot run the C++ compiler {cmd[0]!r}: {e}") from e
    if proc.returncode != 0:
        raise BuildError(f"{cmd[0]} rejected {what}:\n{proc.stderr[-2000:]}")


@functools.cache
def prelude_dir() -> tuple[Path, str]:
    """A folder holding the prelude and, when the compiler can make one, its precompiled
    header; and the key that names them."""
    compiler = cxx()
    text = PRELUDE.read_text()
    key = content_hash(text, " ".join(FLAGS), compiler_version(compiler), cpu_model())
    folder = cache_dir("cpp") / f"prelude_{key}"
    if not (folder / "kiln_prelude.h.gch").exists():
        tmp = Path(tempfile.mkdtemp(dir=cache_dir("cpp")))
        (tmp / "kiln_prelude.h").write_text(text)
        try:
            _run([compiler, *FLAGS, "-x", "c++-header", str(tmp / "kiln_prelude.h"),
                  "-o", str(tmp / "kiln_prelude.h.gch")], "the kernel prelude")
        except BuildError:
            pass  # kernels still compile, reading the prelude as text
        try:
            os.replace(tmp, folder)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return folder, key


def _compile_unit(kernels: list[tuple[str, str, int]]) -> list[BuildResult]:
    """One shared library for several (body, name, nargs) kernels."""
    compiler = cxx()
    include, prelude_key = prelude_dir()
    source = '#include "kiln_prelude.h"\n\n' + "\n\n".join(body for body, _, _ in kernels) + "\n"
    key = content_hash(source, prelude_key, " ".join(FLAGS + LIBS), compiler_version(compiler), cpu_model())
    directory = cache_dir("cpp")
    lib_path = directory / f"unit_{key}.so"
    cached = lib_path.exists()
    if not cached:
        src_path = directory / f"unit_{key}.cpp"
        atomic_write(src_path, source)
        fd, tmp_lib = tempfile.mkstemp(suffix=".so", dir=directory)
        os.close(fd)
        try:
            _run([compiler, *FLAGS, "-shared", f"-I{include}", str(src_path), "-o", tmp_lib, *LIBS],
                 f"kernels {', '.join(name for _, name, _ in kernels)}")
        except BuildError:
            os.unlink(tmp_lib)
            raise
        os.replace(tmp_lib, lib_path)
    lib = ctypes.CDLL(str(lib_path))
    results = []
    for _, name, nargs in kernels:
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * nargs
        fn.restype = None
        results.append(BuildResult(fn, lib_path, cached))
    return results


def build_all(jobs: list[tuple[str, str, int]]) -> list[BuildResult]:
    """jobs: (kernel body, function name, number of pointer arguments) -> loaded functions,
    compiled as one translation unit per core."""
    if not jobs:
        return []
    units = min(len(jobs), os.cpu_count() or 1)
    groups = [list(range(i, len(jobs), units)) for i in range(units)]
    with ThreadPoolExecutor(max_workers=units) as pool:
        built = list(pool.map(lambda g: _compile_unit([jobs[i] for i in g]), groups))
    results: list[BuildResult | None] = [None] * len(jobs)
    for group, unit in zip(groups, built):
        for i, r in zip(group, unit):
            results[i] = r
    return results

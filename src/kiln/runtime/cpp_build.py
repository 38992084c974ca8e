"""Compile C++ kernels with the system compiler, in parallel, cached by content hash.

The kernels of a graph are spread over one translation unit per core; each unit is a
shared library named by the hash of its source, the prelude, flags, compiler and CPU, and
is loaded with ctypes (no torch headers) once the cache has checked it (runtime/cache.py).
The prelude is a precompiled header built once per machine, so a unit costs little more
than its kernels. A second process finds the libraries on disk and compiles nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kiln.runtime import cache

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
def _prelude_entry() -> tuple[cache.Entry, str]:
    """The prelude's cache entry and its text: a unit's key names the prelude by this key
    alone, so that loading cached units never reads the (large) precompiled header."""
    text = PRELUDE.read_text()
    components = cache.key_components(**{
        "prelude source": cache.text_digest(text), "compiler flags": " ".join(FLAGS),
        "compiler": cache.compiler_version(cxx()), "cpu": cache.cpu_model()})
    return cache.entry("cpp prelude", "cpp", "prelude", "", components), text


@functools.cache
def prelude_dir() -> tuple[Path, str]:
    """A folder holding the prelude and, when the compiler can make one, its precompiled
    header; and the key that names them."""
    compiler = cxx()
    entry, text = _prelude_entry()

    def build(folder: Path) -> None:
        folder.mkdir()
        (folder / "kiln_prelude.h").write_text(text)
        try:
            _run([compiler, *FLAGS, "-x", "c++-header", str(folder / "kiln_prelude.h"),
                  "-o", str(folder / "kiln_prelude.h.gch")], "the kernel prelude")
        except BuildError:
            (folder / "kiln_prelude.h.gch").unlink(missing_ok=True)  # kernels read the prelude as text

    folder, _ = cache.load_or_build(entry, build)
    return folder, entry.key


def _unit_entry(source: str, prelude_key: str, names: list[str]) -> cache.Entry:
    components = cache.key_components(**{
        "kernels": " ".join(names), "source": cache.text_digest(source), "prelude": prelude_key,
        "compiler flags": " ".join(FLAGS + LIBS), "compiler": cache.compiler_version(cxx()),
        "cpu": cache.cpu_model()})
    return cache.entry("cpp unit", "cpp", "unit", ".so", components)


def _compile_unit(kernels: list[tuple[str, str, int]]) -> list[BuildResult]:
    """One shared library for several (body, name, nargs) kernels."""
    source = '#include "kiln_prelude.h"\n\n' + "\n\n".join(body for body, _, _ in kernels) + "\n"
    names = [name for _, name, _ in kernels]
    entry = _unit_entry(source, _prelude_entry()[0].key, names)

    def build(lib: Path) -> None:
        include, _ = prelude_dir()
        src_path = lib.parent / f"{entry.path.stem}.cpp"  # kept beside the library for people to read
        cache.write_atomic(src_path, source)
        _run([cxx(), *FLAGS, "-shared", f"-I{include}", str(src_path), "-o", str(lib), *LIBS],
             f"kernels {', '.join(names)}")

    lib_path, cached = cache.load_or_build(entry, build)
    try:
        lib, fns = _load_library(lib_path, kernels)
    except (OSError, AttributeError) as e:
        if not cached:
            raise BuildError(f"the library built for kernels {', '.join(names)} does not load: {e}") from e
        # its checksum held, so it was written so: built by a broken compiler run, or a foreign file
        cache.discard(entry, f"a library that does not load ({e})")
        lib_path, cached = cache.load_or_build(entry, build)
        lib, fns = _load_library(lib_path, kernels)
    return [BuildResult(fn, lib_path, cached) for fn in fns]


def _load_library(path: Path, kernels: list[tuple[str, str, int]]) -> tuple[ctypes.CDLL, list]:
    lib = ctypes.CDLL(str(path))
    fns = []
    for _, name, nargs in kernels:
        pointers, sizes = nargs if isinstance(nargs, tuple) else (nargs, 0)
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * sizes  # sizes after the buffers
        fn.restype = None
        fns.append(fn)
    return lib, fns


def build_all(jobs: list[tuple[str, str, int]]) -> list[BuildResult]:
    """jobs: (kernel body, function name, number of pointer arguments or (pointers, sizes))
    -> loaded functions,
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

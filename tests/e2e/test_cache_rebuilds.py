"""Cache integrity with real compiles: a bad entry is rebuilt with one warning, never
loaded; an unusable cache directory means compiling into a private one. Each case compiles
in a fresh process (a library already loaded in this one would hide what a new process
sees) and checks the result against eager on random inputs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

# Compiles one graph with kiln, checks it against eager, prints what happened as JSON.
CHILD = r"""
import json, logging, sys
import torch
import kiln
from kiln.frontend.backend import REPORTS

warnings = []
class Collect(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(f"{record.name}: {record.getMessage()}")
logging.getLogger("kiln").addHandler(Collect())

def f(x, y):
    return (torch.sigmoid(x) * y + 1.0).sum(-1) - x.amax(-1)

torch.manual_seed(int(sys.argv[1]))
x, y = torch.randn(37, 129), torch.randn(37, 129)
out = kiln.compile(f)(x, y)
torch.testing.assert_close(out, f(x, y), rtol=1e-4, atol=1e-5)
print(json.dumps({"compiled": bool(REPORTS), "hits": REPORTS[-1].cache_hits if REPORTS else None,
                  "warnings": warnings}))
"""


def run_child(cache_dir, seed: int = 0, wrap: list[str] | None = None, wait: bool = True, **env):
    full_env = {**os.environ, "PYTHONPATH": SRC, "KILN_CACHE_DIR": str(cache_dir), "KILN_TARGET": "cpp",
                **env}
    cmd = [*(wrap or []), sys.executable, "-c", CHILD, str(seed)]
    if not wait:  # in a session of its own, so that killing it reaches its compiler too
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return _summary(subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=300))


def _summary(proc) -> dict:
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["compiled"], "kiln ran the graph in ATen"
    return summary


def one_cache_warning(summary: dict, *words: str) -> str:
    """The run logged exactly one warning, from kiln.cache, naming these words."""
    assert len(summary["warnings"]) == 1, summary["warnings"]
    (warning,) = summary["warnings"]
    assert warning.startswith("kiln.cache:") and all(w in warning for w in words), warning
    return warning


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """A cache holding the child's graph, compiled once: tests damage copies of it."""
    root = tmp_path_factory.mktemp("built") / "cache"
    assert run_child(root)["warnings"] == []
    return root


@pytest.fixture
def cache_copy(built_cache, tmp_path):
    root = tmp_path / "cache"
    shutil.copytree(built_cache, root)
    return root


def graph_units(root: Path) -> list[Path]:
    """The libraries of the graph's kernels (not the cost model's probes, runtime/ceilings.py)."""
    return [lib for lib in (root / "cpp").glob("unit_*.so")
            if "kiln_probe_" not in lib.with_suffix(".cpp").read_text()]


def unit_library(root: Path) -> Path:
    (lib,) = graph_units(root)
    return lib


def test_half_truncated_library_is_rebuilt_in_a_fresh_process(cache_copy):
    lib = unit_library(cache_copy)
    size = lib.stat().st_size
    os.truncate(lib, size // 2)  # loading this maps past its end: SIGBUS before the check existed
    summary = run_child(cache_copy, seed=1)
    one_cache_warning(summary, "cpp unit", "truncated", lib.name)
    assert lib.stat().st_size == size
    assert run_child(cache_copy, seed=2) == {"compiled": True, "hits": 1, "warnings": []}


@pytest.mark.parametrize("damage", ["empty", "garbage of the same size"])
def test_empty_or_garbage_library_is_rebuilt_not_run_in_aten(cache_copy, damage):
    lib = unit_library(cache_copy)
    lib.write_bytes(b"" if damage == "empty" else os.urandom(lib.stat().st_size))
    summary = run_child(cache_copy, seed=3)
    one_cache_warning(summary, "cpp unit", "truncated" if damage == "empty" else "corrupted")
    assert summary["hits"] == 0  # rebuilt, and the graph compiled (no fallback warning)


def test_foreign_library_without_a_record_is_rebuilt(cache_copy):
    lib = unit_library(cache_copy)
    Path(str(lib) + ".meta.json").unlink()
    lib.write_bytes(b"\x7fELF not a library")
    one_cache_warning(run_child(cache_copy, seed=4), "cpp unit", "without a readable record")


def test_library_that_does_not_load_despite_its_checksum_is_rebuilt(cache_copy):
    lib = unit_library(cache_copy)
    record_file = Path(str(lib) + ".meta.json")
    record = json.loads(record_file.read_text())
    garbage = b"\x7fELF but not loadable"
    record.update(size=len(garbage), sha256=hashlib.sha256(garbage).hexdigest())
    lib.write_bytes(garbage)
    record_file.write_text(json.dumps(record))
    one_cache_warning(run_child(cache_copy, seed=5), "cpp unit", "does not load")


def test_truncated_precompiled_header_is_rebuilt(cache_copy):
    """The header is read (and checked) only by a compile: the library goes too."""
    (header,) = (cache_copy / "cpp").glob("prelude_*/kiln_prelude.h.gch")
    os.truncate(header, header.stat().st_size // 3)
    unit_library(cache_copy).unlink()
    summary = run_child(cache_copy, seed=6)
    one_cache_warning(summary, "cpp prelude", "truncated")
    record = json.loads(Path(str(header.parent) + ".meta.json").read_text())
    assert header.stat().st_size > record["size"] // 2  # whole again (a rebuild differs in a few bytes)


HANGING_COMPILER = """#!/bin/sh
case "$*" in *--version*) exec g++ "$@";; esac
while [ "$#" -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
printf 'half a precompiled header' > "$out"
sleep 300
"""


def test_compile_killed_midway_leaves_nothing_that_breaks_later_runs(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    compiler = tmp_path / "hanging-g++"
    compiler.write_text(HANGING_COMPILER)
    compiler.chmod(0o755)
    root = tmp_path / "cache"
    proc = run_child(root, wait=False, CXX=str(compiler), KILN_CACHE_DIR=str(root))
    deadline = time.time() + 120
    while not list((root / "cpp").glob("*/kiln_prelude.h.gch")) and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    temps = list((root / "cpp").glob("*.tmp"))
    assert temps, "the compile was not killed while writing its output"
    assert run_child(root, seed=7)["warnings"] == []  # same key: the half-written header is not used
    old = time.time() - 3600
    for temp in temps:
        os.utime(temp, (old, old))
    assert run_child(root, seed=8)["warnings"] == []
    assert not list((root / "cpp").glob("*.tmp")), "a killed compile's temporaries were not swept"


def test_two_processes_compiling_one_graph_into_one_empty_cache(tmp_path):
    root = tmp_path / "cache"
    procs = [run_child(root, seed=10 + i, wait=False) for i in range(2)]
    summaries = [_summary(subprocess.CompletedProcess(p.args, p.wait(300), *p.communicate())) for p in procs]
    assert [s["warnings"] for s in summaries] == [[], []]
    assert len(graph_units(root)) == 1
    assert not list((root / "cpp").glob("*.tmp"))


def _read_only(directory: Path) -> list[str]:
    """A command prefix under which directory cannot be written, even by root."""
    if os.geteuid() != 0:
        directory.chmod(stat.S_IRUSR | stat.S_IXUSR)
        return []
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("running as root without user namespaces: no way to make a read-only directory")
    script = (f'mount --bind "{directory}" "{directory}" && '
              f'mount -o remount,bind,ro "{directory}" && exec "$@"')
    return ["unshare", "-rm", "sh", "-c", script, "sh"]


def test_read_only_cache_dir_compiles_with_one_warning(tmp_path):
    root = tmp_path / "read-only"
    root.mkdir()
    summary = run_child(root, seed=11, wrap=_read_only(root))
    one_cache_warning(summary, "unusable", str(root))
    root.chmod(0o755)
    assert list(root.iterdir()) == []


def test_cache_dir_that_is_a_file_compiles_with_one_warning(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    summary = run_child(path, seed=12)
    one_cache_warning(summary, "unusable", str(path))
    assert path.read_text() == "not a directory"


def test_truncated_triton_source_is_rebuilt(tmp_path):
    pytest.importorskip("triton")
    root = tmp_path / "cache"
    env = {"KILN_TARGET": "triton", "TRITON_INTERPRET": "1"}
    assert run_child(root, seed=13, **env)["warnings"] == []
    sources = list((root / "triton").glob("*.py"))
    assert sources
    for source in sources:
        os.truncate(source, source.stat().st_size // 2)  # imported as is, a SyntaxError
    summary = run_child(root, seed=14, **env)
    assert len(summary["warnings"]) == len(sources), summary["warnings"]
    assert all(w.startswith("kiln.cache:") and "triton source" in w for w in summary["warnings"])

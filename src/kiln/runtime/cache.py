"""Where kiln keeps compiled artifacts, and the versions every cache key includes."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
from pathlib import Path

import torch

from kiln.options import env_cache_dir

KILN_CACHE_VERSION = "1"


def cache_dir(kind: str) -> Path:
    path = Path(env_cache_dir()) / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") or line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def content_hash(*parts: str) -> str:
    h = hashlib.sha256()
    for p in (KILN_CACHE_VERSION, torch.__version__, *parts):
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def atomic_write(path: Path, data: str) -> None:
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(data)
    os.replace(tmp, path)

"""kiln's on-disk cache: where it lives, what every key includes, and entries that are
written atomically and checked before use.

An entry is a file or a folder (the data) plus a record beside it, `<data>.meta.json`, that
holds the data's size and sha256 and the named components of its key. The record is
published before the data, each with os.replace, and a process building an entry holds a
lock on it, so a reader sees no data (a miss), or data and the record that describes it.
Data that does not match its record (truncated, corrupted, emptied) or has none (foreign,
an older kiln) is removed and rebuilt with one warning, never loaded: the dynamic loader
maps a truncated shared library past its end and the process dies of SIGBUS.

A cache directory that cannot be written (read-only, a file, a full disk) is replaced for
the process by a private temporary one, with one warning. Hits and misses go to a journal
(`journal.jsonl`, one appended line each) that `python -m kiln cache` reads.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from kiln.options import env_cache_dir

log = logging.getLogger("kiln.cache")

KILN_CACHE_VERSION = "2"
RECORD_SUFFIX = ".meta.json"
TEMP_SUFFIX = ".tmp"
JOURNAL = "journal.jsonl"
# A temporary file this old belongs to a compile that was killed: no compile runs this long.
STALE_TEMP_SECONDS = 15 * 60
# Below this much free space a cache directory counts as full: a compile writes megabytes.
MIN_FREE_BYTES = 64 << 20
# The journal is cut back to its newest lines when it grows past this.
JOURNAL_MAX_BYTES = 1 << 20
JOURNAL_KEEP_LINES = 2000

_roots: dict[str, Path] = {}  # configured directory -> the one used in this process


# ---- the cache directory --------------------------------------------------------------


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _unusable_reason(root: Path) -> str | None:
    """Why kiln cannot keep a cache in root, or None when it can."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"it cannot be created ({e.strerror or e})"
    if not root.is_dir():
        return "it is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".probe.", suffix=TEMP_SUFFIX, dir=root)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"it cannot be written ({e.strerror or e})"
    try:
        if _free_bytes(root) < MIN_FREE_BYTES:
            return "its disk is full"
    except OSError as e:
        return f"its free space cannot be read ({e.strerror or e})"
    return None


def _private_root(configured: str, reason: str) -> Path:
    private = Path(tempfile.mkdtemp(prefix="kiln-cache-"))
    atexit.register(shutil.rmtree, private, True)
    log.warning("kiln: the cache directory %s is unusable (%s); compiling into %s for this process "
                "(set KILN_CACHE_DIR to a writable directory to keep compiled kernels)",
                configured, reason, private)
    return private


def cache_root() -> Path:
    """The cache directory this process uses: KILN_CACHE_DIR (default ~/.cache/kiln), or a
    private temporary one when that cannot be used."""
    configured = env_cache_dir()
    root = _roots.get(configured)
    if root is None:
        reason = _unusable_reason(Path(configured))
        root = _private_root(configured, reason) if reason else Path(configured)
        _roots[configured] = root
        sweep_stale_temps(root)
        _trim_journal(root)
    return root


def give_up_root(reason: str) -> Path:
    """The cache directory failed while in use (a full disk): a private one from now on."""
    configured = env_cache_dir()
    root = _private_root(configured, reason)
    _roots[configured] = root
    return root


def cache_dir(kind: str) -> Path:
    path = cache_root() / kind
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where the folder should be, or the directory turned read-only
        path = give_up_root(f"its folder {kind} cannot be made: {e.strerror or e}") / kind
        path.mkdir(parents=True, exist_ok=True)
    return path


def sweep_stale_temps(root: Path, older_than: float = STALE_TEMP_SECONDS) -> int:
    """Remove the temporary files and folders of compiles killed midway; the number removed."""
    removed, now = 0, time.time()
    try:
        folders = [root, *(p for p in root.iterdir() if p.is_dir() and not p.name.endswith(TEMP_SUFFIX))]
    except OSError:
        return 0
    for folder in folders:
        for temp in folder.glob(f"*{TEMP_SUFFIX}"):
            try:
                if now - temp.lstat().st_mtime > older_than:
                    remove(temp)
                    removed += 1
            except OSError:
                pass
    return removed


# ---- versions and keys --------------------------------------------------------------


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


def text_digest(text: str) -> str:
    """A short name for a long key component (a source file): its sha256."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def key_components(**components: str) -> dict[str, str]:
    """An entry's key components, each named for `kiln cache why`, with the versions every
    key includes."""
    return {"kiln cache format": KILN_CACHE_VERSION, "torch version": torch.__version__, **components}


def key_of(components: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(components):
        h.update(f"{name}\0{components[name]}\0".encode())
    return h.hexdigest()[:24]


# ---- entries ------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One cached artifact: kind names it to a person ("cpp unit"); path is its data."""

    kind: str
    key: str
    path: Path
    components: dict

    @property
    def record(self) -> Path:
        return record_path(self.path)


def record_path(data: Path) -> Path:
    return data.with_name(data.name + RECORD_SUFFIX)


def entry(kind: str, folder: str, stem: str, suffix: str, components: dict[str, str]) -> Entry:
    """The entry `<folder>/<stem>_<key><suffix>` of the cache, keyed by its components."""
    key = key_of(components)
    return Entry(kind, key, cache_dir(folder) / f"{stem}_{key}{suffix}", components)


def _digest(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file, or of a folder's files (names and contents, in order)."""
    h, size = hashlib.sha256(), 0
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        data = f.read_bytes()
        if path.is_dir():
            h.update(f"{f.relative_to(path)}\0{len(data)}\0".encode())
        h.update(data)
        size += len(data)
    return size, h.hexdigest()


def read_record(data: Path) -> dict | None:
    try:
        record = json.loads(record_path(data).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def check(e: Entry) -> str | None:
    """None when the entry's data can be used, "missing" when it is not there (or still being
    written), else why it is bad."""
    if not e.path.exists():
        return "missing"
    record = read_record(e.path)
    if record is None:
        return "without a readable record (written by another program or an older kiln)"
    if (record.get("format"), record.get("kind"), record.get("key")) != (KILN_CACHE_VERSION, e.kind, e.key):
        return "recorded for another kind, key or kiln cache format"
    try:
        size, sha = _digest(e.path)
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    if size != record.get("size"):
        return f"truncated or extended ({size} bytes where {record.get('size')} were written)"
    if sha != record.get("sha256"):
        return "corrupted (its checksum differs from the one written)"
    return None


def remove(path: Path) -> None:
    """Remove a file or folder: folders are renamed away first, so no reader sees one half gone."""
    if path.is_dir() and not path.is_symlink():
        away = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        try:
            os.replace(path, away)
        except OSError:
            away = path
        shutil.rmtree(away, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def discard(e: Entry, reason: str) -> None:
    """Remove a bad entry, with the one warning that says why it is rebuilt."""
    log.warning("kiln: cached %s %s is %s; rebuilding it", e.kind, e.path, reason)
    remove(e.path)
    with contextlib.suppress(OSError):
        e.record.unlink()


def temp_path(near: Path) -> Path:
    """A fresh temporary name in near's folder (os.replace is atomic only within one file
    system); its suffix lets sweep_stale_temps find it if its writer is killed."""
    return near.with_name(f".{near.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")


@contextlib.contextmanager
def _locked(e: Entry) -> Iterator[None]:
    """Hold the entry's build lock (released by the kernel if this process dies)."""
    try:
        import fcntl
    except ImportError:  # no advisory locks: concurrent builders each publish a whole entry
        yield
        return
    with open(e.path.with_name(e.path.name + ".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
            locked = True
        except OSError:  # a file system without locks (some network mounts): build unlocked
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(f, fcntl.LOCK_UN)


def _publish(e: Entry, built: Path) -> None:
    """Move a built entry into place: its record first, then its data."""
    size, sha = _digest(built)
    record = {"format": KILN_CACHE_VERSION, "kind": e.kind, "key": e.key, "size": size, "sha256": sha,
              "components": e.components, "created": time.time()}
    write_atomic(e.record, json.dumps(record, indent=1))
    if e.path.is_dir():  # a folder cannot replace a folder: remove the old (bad) one first
        remove(e.path)
    os.replace(built, e.path)


# Errors of a cache directory that stopped taking writes, not of the build itself.
_DIRECTORY_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def load_or_build(e: Entry, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The entry's data path and whether it was found in the cache. build(path) writes the
    data (a file or a folder) at a temporary path; a bad entry is removed and rebuilt. When
    the cache directory stops taking writes, the entry is built in a private one."""
    try:
        return _load_or_build(e, build)
    except Exception as err:
        reason = _directory_failure(err, e.path.parent)
        if reason is None:
            raise
        root = give_up_root(reason)
    folder = root / e.path.parent.name
    folder.mkdir(parents=True, exist_ok=True)
    return _load_or_build(Entry(e.kind, e.key, folder / e.path.name, e.components), build)


def _directory_failure(err: Exception, folder: Path) -> str | None:
    """Why the cache directory, not the build, made err; None when it did not. A compiler
    that could not write its output (a full disk) reports a build error, so the directory
    is probed again."""
    if isinstance(err, OSError) and err.errno in _DIRECTORY_ERRORS:
        return err.strerror or str(err)
    return _unusable_reason(folder)


def _load_or_build(e: Entry, build: Callable[[Path], None]) -> tuple[Path, bool]:
    problem = check(e)
    if problem is None:
        journal("hit", e)
        return e.path, True
    with _locked(e):
        problem = check(e)
        if problem is None:  # another process built it while this one waited
            journal("hit", e)
            return e.path, True
        if problem != "missing":
            discard(e, problem)
        temp = temp_path(e.path)
        try:
            build(temp)
            _publish(e, temp)
        finally:
            if temp.exists():
                remove(temp)
    journal("miss", e, "not in the cache" if problem == "missing" else problem)
    return e.path, False


def write_atomic(path: Path, data: str) -> None:
    """Write a file so that no reader ever sees part of it."""
    temp = temp_path(path)
    try:
        temp.write_text(data)
        os.replace(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()



# ---- the journal of hits and misses ---------------------------------------------------


def journal(event: str, e: Entry, reason: str = "") -> None:
    """Append one line (atomic for lines this short with O_APPEND); never fails a compile."""
    line = {"t": round(time.time(), 3), "event": event, "kind": e.kind, "dir": e.path.parent.name,
            "file": e.path.name}
    if reason:
        line["reason"] = reason
    log.info("%s %s %s%s", event, e.kind, e.path.name, f" ({reason})" if reason else "")  # KILN_LOGS=cache
    try:
        fd = os.open(e.path.parent.parent / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def read_journal(root: Path) -> list[dict]:
    try:
        text = (root / JOURNAL).read_text()
    except OSError:
        return []
    lines = []
    for raw in text.splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(raw))
    return [line for line in lines if isinstance(line, dict)]


def _trim_journal(root: Path) -> None:
    path = root / JOURNAL
    try:
        if path.stat().st_size > JOURNAL_MAX_BYTES:
            kept = read_journal(root)[-JOURNAL_KEEP_LINES:]
            write_atomic(path, "".join(f"{json.dumps(line)}\n" for line in kept))
    except OSError:
        pass

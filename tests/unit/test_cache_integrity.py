"""Cache integrity at the entry layer, and `python -m kiln cache`, in this process: no
compiler needed. tests/e2e/test_cache_rebuilds.py damages real compiled entries."""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from pathlib import Path

import pytest

from kiln.runtime import cache
from kiln.tools.__main__ import main as kiln_main


@pytest.fixture
def root(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    return path


def text_entry(text: str, **components: str) -> cache.Entry:
    return cache.entry("test text", "test", "text", ".txt",
                       cache.key_components(source=cache.text_digest(text), **components))


def write(text: str):
    return lambda path: path.write_text(text)


def cache_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kiln.cache" and r.levelno >= logging.WARNING]


def test_an_entry_is_built_once_then_found(root, caplog):
    e = text_entry("hello")
    assert cache.load_or_build(e, write("hello")) == (e.path, False)
    assert cache.load_or_build(e, write("never called")) == (e.path, True)
    assert e.path.read_text() == "hello" and cache.check(e) is None
    assert [(line["event"], line["file"]) for line in cache.read_journal(root)] == [
        ("miss", e.path.name), ("hit", e.path.name)]
    assert cache_warnings(caplog) == []


@pytest.mark.parametrize("damage, reason", [
    (lambda p: p.write_text("hellO"), "corrupted"),
    (lambda p: p.write_text("hel"), "truncated"),
    (lambda p: p.write_text(""), "truncated"),
    (lambda p: cache.record_path(p).unlink(), "without a readable record"),
    (lambda p: cache.record_path(p).write_text("{not json"), "without a readable record"),
])
def test_a_bad_entry_is_rebuilt_with_one_warning(root, caplog, damage, reason):
    e = text_entry("hello")
    cache.load_or_build(e, write("hello"))
    damage(e.path)
    assert reason in cache.check(e)
    assert cache.load_or_build(e, write("hello")) == (e.path, False)
    assert e.path.read_text() == "hello" and cache.check(e) is None
    (warning,) = cache_warnings(caplog)
    assert reason in warning and str(e.path) in warning


def test_a_file_system_without_locks_still_builds(root, monkeypatch):
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    e = text_entry("unlocked")
    assert cache.load_or_build(e, write("unlocked")) == (e.path, False)
    assert cache.check(e) is None


def test_a_record_of_another_key_is_foreign(root):
    a, b = text_entry("a"), text_entry("b")
    cache.load_or_build(a, write("a"))
    cache.load_or_build(b, write("b"))
    cache.record_path(a.path).write_text(cache.record_path(b.path).read_text())
    assert "another kind, key" in cache.check(a)


def test_a_failed_build_leaves_no_temporary_and_no_entry(root):
    e = text_entry("x")

    def fail(path: Path) -> None:
        path.write_text("half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        cache.load_or_build(e, fail)
    assert sorted(p.name for p in e.path.parent.iterdir()) == [e.path.name + ".lock"]
    assert cache.load_or_build(e, write("x")) == (e.path, False)


def test_folder_entries_are_checked_file_by_file(root, caplog):
    e = cache.entry("test folder", "test", "folder", "", cache.key_components(v="1"))

    def build(path: Path) -> None:
        path.mkdir()
        (path / "a.h").write_text("a")
        (path / "b.gch").write_bytes(b"0123456789")

    cache.load_or_build(e, build)
    (e.path / "b.gch").write_bytes(b"01234")
    assert "truncated" in cache.check(e)
    assert cache.load_or_build(e, build) == (e.path, False)
    assert (e.path / "b.gch").read_bytes() == b"0123456789"


def test_only_stale_temporaries_are_swept(root):
    folder = cache.cache_dir("test")
    young, old = cache.temp_path(folder / "young"), cache.temp_path(folder / "old")
    young.write_text("a compile still running")
    old.mkdir()
    (old / "kiln_prelude.h.gch").write_text("half")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    assert cache.sweep_stale_temps(cache.cache_root()) == 1
    assert young.exists() and not old.exists()


def test_a_full_disk_means_a_private_cache_with_one_warning(root, monkeypatch, caplog):
    monkeypatch.setattr(cache, "_free_bytes", lambda path: 1024)
    private = cache.cache_root()
    assert private != root and private.is_dir()
    assert cache.cache_root() == private
    (warning,) = cache_warnings(caplog)
    assert "disk is full" in warning and str(root) in warning


def test_a_directory_that_stops_taking_writes_means_a_private_cache(root, caplog):
    e = text_entry("y")

    def disk_full(path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    calls = []

    def build(path: Path) -> None:
        calls.append(path)
        (disk_full if len(calls) == 1 else write("y"))(path)

    path, cached = cache.load_or_build(e, build)
    assert not cached and path.read_text() == "y" and not path.is_relative_to(root)
    (warning,) = cache_warnings(caplog)
    assert "No space left" in warning


def test_a_compiler_failing_on_a_full_disk_means_a_private_cache(root, monkeypatch, caplog):
    e = text_entry("z")
    cache.cache_root()
    free = iter([1024])  # the disk is full when the compiler fails, not afterwards

    def compiler(path: Path) -> None:
        if not path.is_relative_to(root):
            return path.write_text("z")
        monkeypatch.setattr(cache, "_free_bytes", lambda _: next(free, 1 << 40))
        raise RuntimeError("g++: fatal error: cannot write output")

    path, cached = cache.load_or_build(e, compiler)
    assert not cached and path.read_text() == "z" and not path.is_relative_to(root)
    (warning,) = cache_warnings(caplog)
    assert "disk is full" in warning


def test_a_real_build_error_is_raised_as_is(root):
    def compiler(path: Path) -> None:
        raise RuntimeError("g++ rejected the kernel")

    with pytest.raises(RuntimeError, match="rejected"):
        cache.load_or_build(text_entry("bad"), compiler)


def test_a_file_where_a_kind_folder_belongs_means_a_private_cache(root, caplog):
    root.mkdir()
    (root / "test").write_text("in the way")
    e = text_entry("w")
    path, cached = cache.load_or_build(e, write("w"))
    assert not cached and path.read_text() == "w" and not path.is_relative_to(root)
    (warning,) = cache_warnings(caplog)
    assert "folder test cannot be made" in warning


def test_keys_differ_in_every_component():
    base = cache.key_components(source="s", flags="-O3")
    assert cache.key_of(base) == cache.key_of(dict(base))
    changed = {cache.key_of({**base, name: "other"}) for name in base}
    assert len(changed | {cache.key_of(base)}) == len(base) + 1


def test_cache_ls_lists_entries_with_size_age_and_hits(root, capsys):
    e = text_entry("listed")
    cache.load_or_build(e, write("listed"))
    cache.load_or_build(e, write("listed"))
    assert kiln_main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if e.path.name in line]
    assert row.split()[:2] == ["test", "text"] and e.key[:12] in row and "6 B" in row
    assert row.split()[-2] == "1"  # one hit


def test_cache_why_names_the_component_that_differs(root, capsys, monkeypatch):
    old = text_entry("same source", **{"torch version": "2.11.0"})
    cache.load_or_build(old, write("same source"))
    cache.load_or_build(text_entry("other source"), write("other source"))
    new = text_entry("same source", **{"torch version": "2.13.0"})
    cache.load_or_build(new, write("same source"))
    assert kiln_main(["cache", "why", "--count", "1"]) == 0
    out = capsys.readouterr().out
    assert "miss" in out and new.path.name in out and "not in the cache" in out
    assert f"nearest: test/{old.path.name}" in out
    assert "torch version: 2.11.0 there, 2.13.0 here" in out
    assert "source:" not in out


def test_cache_clear_older_than_keeps_recent_entries(root, capsys):
    e = text_entry("recent")
    cache.load_or_build(e, write("recent"))
    assert kiln_main(["cache", "clear", "--older-than", "1"]) == 0
    assert e.path.exists()
    record = json.loads(cache.record_path(e.path).read_text())
    record["created"] = time.time() - 3 * 86400
    cache.record_path(e.path).write_text(json.dumps(record))
    (root / cache.JOURNAL).unlink()  # no use since
    assert kiln_main(["cache", "clear", "--older-than", "1"]) == 0
    assert not e.path.exists() and not cache.record_path(e.path).exists()
    assert kiln_main(["cache", "clear"]) == 0
    assert not root.exists()
    assert "cleared" in capsys.readouterr().out


def test_cache_clear_leaves_files_that_are_not_kiln_s(root, capsys):
    cache.load_or_build(text_entry("mine"), write("mine"))
    (root / "notes.txt").write_text("a user's file")
    assert kiln_main(["cache", "clear"]) == 0
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]
    assert "left 1 other files there: notes.txt" in capsys.readouterr().out


def test_cache_command_on_a_cache_dir_that_is_a_file(root, capsys):
    root.parent.mkdir(exist_ok=True)
    root.write_text("a file")
    assert kiln_main(["cache", "ls"]) == 0 and kiln_main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.count("not a directory") == 2
    assert root.read_text() == "a file"

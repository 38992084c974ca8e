"""`python -m kiln cache ls | why | clear`: what kiln's cache holds, why it missed, emptying it.

Reads the records beside each entry and the journal of hits and misses (runtime/cache.py);
it never builds or repairs anything.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kiln.runtime import cache, graph_cache


@dataclass(frozen=True)
class CachedEntry:
    kind: str
    key: str
    data: Path
    size: int
    created: float
    components: dict


def entries(root: Path) -> list[CachedEntry]:
    """Every entry with a readable record, oldest first."""
    found = []
    for record_file in root.glob(f"*/*{cache.RECORD_SUFFIX}"):
        data = record_file.with_name(record_file.name[: -len(cache.RECORD_SUFFIX)])
        record = cache.read_record(data)
        if record is None or not data.exists():
            continue
        found.append(CachedEntry(str(record.get("kind", "?")), str(record.get("key", "?")), data,
                                 int(record.get("size", 0)), float(record.get("created", 0.0)),
                                 dict(record.get("components", {}))))
    return sorted(found, key=lambda e: e.created)


def age(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f} {unit}"
    return f"{seconds:.0f} s"


def size_text(n: int) -> str:
    for unit, length in (("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= length:
            return f"{n / length:.1f} {unit}"
    return f"{n} B"


def _hits(root: Path) -> tuple[Counter, dict[str, float]]:
    """Hits per entry file, and the time each entry was last used."""
    hits, last = Counter(), {}
    for line in cache.read_journal(root):
        name = str(line.get("file"))
        if line.get("event") == "hit":
            hits[name] += 1
        last[name] = max(last.get(name, 0.0), float(line.get("t", 0.0)))
    return hits, last


def _name(e: CachedEntry) -> str:
    return f"{e.data.parent.name}/{e.data.name}"


def ls(root: Path) -> str:
    if root.exists() and not root.is_dir():
        return f"{root} is not a directory: kiln compiles into a private temporary cache"
    found = entries(root)
    if not found:
        return f"{root}: no entries"
    hits, _ = _hits(root)
    now = time.time()
    rows = [("kind", "key", "size", "age", "hits", "file")]
    rows += [(e.kind, e.key[:12], size_text(e.size), age(now - e.created), str(hits[e.data.name]), _name(e))
             for e in found]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    total = sum(e.size for e in found)
    return "\n".join([f"{root}: {len(found)} entries, {size_text(total)}", *lines])


def differences(a: dict, b: dict) -> list[str]:
    """The names of the key components in which two entries differ."""
    return sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))


def _short(value) -> str:
    text = "(none)" if value is None else str(value)
    return text if len(text) <= 48 else text[:45] + "..."


# Components whose value is a digest: a reader that says what the digest stands for differs in.
COMPONENT_DETAILS = {"graph": graph_cache.graph_difference}


def why(root: Path, count: int = 5) -> str:
    """For the newest misses: the nearest other entry of the same kind and what differs."""
    misses = [line for line in cache.read_journal(root) if line.get("event") == "miss"][-count:]
    if not misses:
        return f"{root}: no misses recorded"
    found = entries(root)
    by_file = {e.data.name: e for e in found}
    now, out = time.time(), []
    for miss in misses:
        out.append(f"miss {age(now - float(miss.get('t', now)))} ago: {miss.get('kind')} {miss.get('file')} "
                   f"({miss.get('reason', 'not in the cache')})")
        missed = by_file.get(str(miss.get("file")))
        if missed is None:
            out.append("  its entry is no longer in the cache")
            continue
        others = [e for e in found if e.kind == missed.kind and e.key != missed.key]
        # what the cache held when it missed, when any of it is left
        others = [e for e in others if e.created < missed.created] or others
        if not others:
            out.append(f"  no other {missed.kind} entry to compare with")
            continue
        nearest = min(others, key=lambda e: (len(differences(e.components, missed.components)), -e.created))
        out.append(f"  nearest: {_name(nearest)} ({age(now - nearest.created)} old), differs in:")
        for component in differences(nearest.components, missed.components):
            detail = COMPONENT_DETAILS.get(component, lambda a, b: None)(nearest.data, missed.data)
            values = (f"{_short(nearest.components.get(component))} there, "
                      f"{_short(missed.components.get(component))} here")
            out.append(f"    {component}: {detail or values}")
    return "\n".join(out)


def clear(root: Path, older_than_days: float | None = None) -> str:
    """Remove everything, or only the entries not used for older_than_days."""
    if not root.is_dir():
        return f"nothing to clear: {root} is not a directory"
    if older_than_days is None:
        return _clear_all(root)
    _, last_used = _hits(root)
    cutoff, removed = time.time() - older_than_days * 86400, 0
    for e in entries(root):
        if max(e.created, last_used.get(e.data.name, 0.0)) < cutoff:
            stem = e.data.name.split(".")[0]
            for path in [e.data, *e.data.parent.glob(f"{stem}.*")]:
                cache.remove(path)
            removed += 1
    return f"removed {removed} entries unused for {older_than_days:g} days from {root}"


# Folders kiln writes its entries into; clear also removes any folder holding entry records
# or only the locks and temporaries that entries leave behind.
KILN_FOLDERS = ("cpp", "triton", graph_cache.FOLDER)


def _kiln_owned(path: Path) -> bool:
    if path.name == cache.JOURNAL or path.name.endswith(cache.TEMP_SUFFIX):
        return True
    if not path.is_dir():
        return False
    names = [p.name for p in path.iterdir()]
    return (path.name in KILN_FOLDERS or any(n.endswith(cache.RECORD_SUFFIX) for n in names)
            or all(n.endswith((".lock", cache.TEMP_SUFFIX)) for n in names))  # what entries leave behind


def _clear_all(root: Path) -> str:
    """Remove kiln's folders and journal, and root when nothing else is in it: a cache
    directory pointed at a folder of other files loses none of them."""
    others = []
    for path in root.iterdir():
        if not _kiln_owned(path):
            others.append(path.name)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if others:
        return (f"cleared kiln's entries from {root}; left {len(others)} other files there: "
                f"{', '.join(others[:5])}")
    root.rmdir()
    return f"cleared {root}"

"""kiln's logs, by topic, through Python's logging: one logger per topic, `kiln.<topic>`.

    KILN_LOGS=passes,fusion        those topics at info level
    KILN_LOGS=+passes,-fallbacks   passes at debug level (each pass's IR), fallbacks quiet
    KILN_LOGS=all / +all           every topic, at info / debug level

Under TORCH_LOGS, `+kiln` (or `kiln`) shows every topic, and the names torch itself knows
(`fusion`, `cache`, `recompiles`) turn on kiln's topics of those names with torch's. torch
rejects names it does not know when it is imported, before kiln can register any: the other
topics are KILN_LOGS's only.

Without either, the loggers inherit from `kiln`: warnings show (a graph left to ATen, a cache
directory unusable, a compile still running after WARN_AFTER_S), nothing else.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Callable

TOPICS = {
    "passes": "each pass of each compile: time and summary; at debug, the IR after it",
    "fusion": "fusion decisions: a summary per graph; at debug, every decision with its model code",
    "cache": "kernel and whole-graph cache hits, misses and stores",
    "recompiles": "a graph compiled again for a new shape",
    "kernels": "kernels built per graph; at debug, each kernel's generated source",
    "autotune": "launch configurations timed and chosen",
    "fallbacks": "what runs in ATen instead of kiln's kernels, and why",
}
ROOT = "kiln"
LONG_STEP_S = 5.0  # a compile running longer says which pass it is in, this often (info level)
WARN_AFTER_S = 30.0  # from then on as warnings: a compile this long is pathological, and must show
_KILN_HANDLER = "kiln.logs handler"  # the name of the handler configure() adds


def logger(topic: str) -> logging.Logger:
    if topic not in TOPICS:
        raise ValueError(f"kiln has no log topic {topic!r} (topics: {', '.join(TOPICS)})")
    return logging.getLogger(f"{ROOT}.{topic}")


passes = logger("passes")
fusion = logger("fusion")
cache = logger("cache")
recompiles = logger("recompiles")
kernels = logger("kernels")
autotune = logger("autotune")
fallbacks = logger("fallbacks")


def parse(spec: str) -> tuple[dict[str, int], list[str]]:
    """KILN_LOGS's text -> (topic -> level, the names that are no topic)."""
    levels: dict[str, int] = {}
    unknown: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        level = logging.DEBUG if item[0] == "+" else logging.ERROR if item[0] == "-" else logging.INFO
        name = item.lstrip("+-")
        if name == "all":
            levels.update(dict.fromkeys(TOPICS, level))
        elif name in TOPICS:
            levels[name] = level
        else:
            unknown.append(name)
    return levels, unknown


def from_torch_logs() -> dict[str, int]:
    """The levels TORCH_LOGS gives kiln's topics, read from torch's parsed log state: its
    artifacts of the same names (fusion, recompiles) and its `cache` log. `kiln` itself torch
    treats as a module name and sets on the `kiln` logger, which the topics inherit."""
    try:
        from torch._logging import _internal as torch_logs
    except ImportError:
        return {}
    state = getattr(torch_logs, "log_state", None)
    registry = getattr(torch_logs, "log_registry", None)
    if state is None or registry is None:
        return {}
    levels: dict[str, int] = {}
    for topic in TOPICS:
        if topic in getattr(state, "artifact_names", ()):
            levels[topic] = logging.DEBUG
        qnames = getattr(registry, "log_alias_to_log_qnames", {}).get(topic, ())
        given = getattr(state, "log_qname_to_level", {})
        set_levels = [given[q] for q in qnames if q in given]
        if set_levels:
            levels[topic] = min(int(v) if str(v).isdigit() else logging.getLevelName(v) for v in set_levels)
    return levels


def configure(spec: str | None = None) -> dict[str, int]:
    """Set the topics' levels from spec (KILN_LOGS when None) over TORCH_LOGS's, and print the
    enabled ones to stderr unless the `kiln` logger has a handler already (torch's, a user's).
    Returns the levels set."""
    if spec is None:
        from kiln.options import env_logs

        spec = env_logs()
    levels, unknown = parse(spec)
    levels = {**from_torch_logs(), **levels}
    for topic in TOPICS:
        logger(topic).setLevel(levels.get(topic, logging.NOTSET))
    root = logging.getLogger(ROOT)
    ours = [h for h in root.handlers if h.get_name() == _KILN_HANDLER]
    for h in ours:
        root.removeHandler(h)
    if any(level < logging.WARNING for level in levels.values()) and not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_KILN_HANDLER)
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        root.addHandler(handler)
        root.propagate = False  # printed once, here
    elif ours:
        root.propagate = True
    if unknown:
        root.warning("kiln: KILN_LOGS names %s, which are no topics (topics: %s, all)",
                     ", ".join(unknown), ", ".join(TOPICS))
    return levels


def debug_text(log: logging.Logger, what: str, text: Callable[[], str]) -> None:
    """Log text() at debug level; text is only made when the level is on."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s:\n%s", what, text())


# --- progress of long steps ------------------------------------------------------------------

_current = threading.local()  # the innermost Progress of this thread


def step(part: str) -> None:
    """The current long step of this thread (if any) is now in part."""
    progress = getattr(_current, "progress", None)
    if progress is not None:
        progress.step(part)


class Progress:
    """A long step (a compile) that names its current part (a pass): while it runs past
    LONG_STEP_S, a watcher thread logs, every LONG_STEP_S, the part it is in; at info level,
    and as warnings once it has run WARN_AFTER_S."""

    def __init__(self, what: str, log: logging.Logger = passes, every_s: float | None = None):
        self.what, self.log, self.every_s = what, log, every_s if every_s is not None else LONG_STEP_S
        self.part, self.start, self.part_start, self.next_report = "", 0.0, 0.0, 0.0

    def step(self, part: str) -> None:
        self.part, self.part_start = part, time.perf_counter()

    def __enter__(self) -> Progress:
        self.start = self.part_start = time.perf_counter()
        self.next_report = self.start + self.every_s
        self.outer = getattr(_current, "progress", None)
        _current.progress = self
        _WATCHER.add(self)
        return self

    def __exit__(self, *exc) -> None:
        _WATCHER.remove(self)
        _current.progress = self.outer
        elapsed = time.perf_counter() - self.start
        if elapsed >= self.every_s:
            self.log.log(self._level(elapsed), "kiln: %s took %.1f s", self.what, elapsed)

    def _level(self, elapsed: float) -> int:
        return logging.WARNING if elapsed >= WARN_AFTER_S else logging.INFO

    def report(self, now: float) -> None:
        self.log.log(self._level(now - self.start), "kiln: %s still running after %.1f s: in %s for %.1f s",
                     self.what, now - self.start, self.part or "its first step", now - self.part_start)
        self.next_report = now + self.every_s


class _Watcher:
    """One daemon thread, awake only while some Progress runs."""

    def __init__(self) -> None:
        self.running: set[Progress] = set()
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def add(self, p: Progress) -> None:
        with self.cond:
            self.running.add(p)
            if self.thread is None:
                self.thread = threading.Thread(target=self._watch, name="kiln progress", daemon=True)
                self.thread.start()
            self.cond.notify()

    def remove(self, p: Progress) -> None:
        with self.cond:
            self.running.discard(p)

    def _watch(self) -> None:
        with self.cond:
            while True:
                if not self.running:
                    self.cond.wait()
                    continue
                now = time.perf_counter()
                for p in list(self.running):
                    if now >= p.next_report:
                        p.report(now)
                wake = min(p.next_report for p in self.running)
                self.cond.wait(max(wake - time.perf_counter(), 0.05))


_WATCHER = _Watcher()

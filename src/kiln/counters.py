"""Counters a user or a test can read: `kiln.stats()`.

They count what this process did since it started (or since `kiln.reset_stats()`): ATen
graphs kiln compiled, the programs compiled for each symbolic-shape graph, kernels built and
found in the cache, and what ran in ATen, with reasons.
"""

from __future__ import annotations

import collections
import copy
import threading
from dataclasses import dataclass, field


@dataclass
class Stats:
    graphs_compiled: int = 0  # forward, backward and inference ATen graphs kiln compiled
    graphs_from_cache: int = 0  # of those, programs loaded from the whole-graph cache
    # per Dynamo graph traced with symbolic shapes (numbered in the order they were met):
    # the programs kiln compiled for the concrete shapes it was called with
    shape_variants: dict[int, int] = field(default_factory=dict)
    # ATen graphs with symbolic shapes kiln compiled once for their whole shape family
    graphs_symbolic: int = 0
    # reason -> how many symbolic graphs kiln compiled per shape instead (what needed a number)
    per_shape: collections.Counter = field(default_factory=collections.Counter)
    # guards on sizes that kiln's compile of a family added (each makes Dynamo specialize)
    specialized: int = 0
    kernels_built: int = 0  # kernels compiled by the C++ compiler or Triton
    kernel_cache_hits: int = 0  # kernels loaded from kiln's cache instead
    # binaries of shape-family kernels compiled at a launch that needed one (a configuration,
    # indexing or size divisibility not compiled with the graph), and the seconds they took
    binaries_at_launch: int = 0
    seconds_at_launch: float = 0.0
    # "kind: reason" -> how many whole graphs ran in ATen so
    graphs_in_aten: collections.Counter = field(default_factory=collections.Counter)
    # op -> how many ATen calls kiln placed inside compiled programs (no lowering, or by design)
    ops_in_aten: collections.Counter = field(default_factory=collections.Counter)

    def __str__(self) -> str:
        lines = [f"graphs compiled: {self.graphs_compiled} ({self.graphs_from_cache} from the graph cache)",
                 f"kernels built: {self.kernels_built}, from the cache: {self.kernel_cache_hits}"]
        if self.binaries_at_launch:
            lines.append(f"family binaries compiled at a launch: {self.binaries_at_launch} "
                         f"({self.seconds_at_launch:.2f} s)")
        if self.graphs_symbolic or self.specialized:
            lines.append(f"graphs compiled once for their shape family: {self.graphs_symbolic}, "
                         f"sizes specialized by kiln: {self.specialized}")
        for why, n in self.per_shape.most_common():
            lines.append(f"graph compiled per shape x{n}: {why}")
        if self.shape_variants:
            lines.append("shape variants per symbolic graph: " +
                         ", ".join(f"graph {g}: {n}" for g, n in sorted(self.shape_variants.items())))
        for why, n in self.graphs_in_aten.most_common():
            lines.append(f"graph in ATen x{n}: {why}")
        if self.ops_in_aten:
            ops = self.ops_in_aten.most_common()
            lines.append("ops in ATen: " + ", ".join(f"{op} x{n}" for op, n in ops))
        return "\n".join(lines)


_STATS = Stats()
_LOCK = threading.Lock()


def snapshot() -> Stats:
    with _LOCK:
        return copy.deepcopy(_STATS)


def reset() -> None:
    global _STATS
    with _LOCK:
        _STATS = Stats()


def graph_compiled(kernels: int, cache_hits: int, from_cache: bool = False) -> None:
    with _LOCK:
        _STATS.graphs_compiled += 1
        _STATS.graphs_from_cache += from_cache
        _STATS.kernels_built += kernels - cache_hits
        _STATS.kernel_cache_hits += cache_hits


def shape_variant(graph: int) -> int:
    """Count one more program for a symbolic graph; returns how many it has."""
    with _LOCK:
        _STATS.shape_variants[graph] = _STATS.shape_variants.get(graph, 0) + 1
        return _STATS.shape_variants[graph]


def binary_at_launch(seconds: float) -> None:
    with _LOCK:
        _STATS.binaries_at_launch += 1
        _STATS.seconds_at_launch += seconds


def graph_symbolic() -> None:
    with _LOCK:
        _STATS.graphs_symbolic += 1


def compiled_per_shape(reason: str) -> None:
    with _LOCK:
        _STATS.per_shape[reason[:160]] += 1


def sizes_specialized(guards: int) -> None:
    with _LOCK:
        _STATS.specialized += guards


def ran_in_aten(scope: str, kind: str, reason: str, op: str) -> None:
    with _LOCK:
        if scope == "graph":
            _STATS.graphs_in_aten[f"{kind}: {reason[:160]}"] += 1
        else:
            _STATS.ops_in_aten[op] += 1

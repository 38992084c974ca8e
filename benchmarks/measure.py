"""Timing, correctness and compile-report helpers for benchmarks/run.py."""

from __future__ import annotations

import gc
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from benchmarks.cases import outputs_of

# Compiled code may sum in another order than eager: tolerances fit each dtype's precision.
TOLERANCE = {
    torch.float32: dict(rtol=1e-4, atol=1e-4),
    torch.float64: dict(rtol=1e-7, atol=1e-9),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
}

WARMUP_CALLS = 3


def check_close(actual, expected) -> str | None:
    """None when every output matches eager, else the first mismatch in one line."""
    got, want = outputs_of(actual), outputs_of(expected)
    if len(got) != len(want):
        return f"{len(got)} outputs, eager has {len(want)}"
    for i, (a, e) in enumerate(zip(got, want)):
        try:
            torch.testing.assert_close(a, e, equal_nan=True, **TOLERANCE.get(e.dtype, {}))
        except AssertionError as err:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            return f"output {i}: " + "; ".join(lines[:3])
    return None


def first_call(fn: Callable, args: tuple) -> tuple[float, object]:
    """Wall time of one call (the compile, for a compiled function that has not run yet)."""
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def median_seconds(fn: Callable, args: tuple, runs: int) -> float:
    for _ in range(WARMUP_CALLS):
        fn(*args)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def time_interleaved(variants: dict[str, Callable], args: tuple, repeat: int) -> dict[str, list[float]]:
    """Samples of one call of each variant, taken in turns (rotating the order each round)
    so that a burst of load from other processes hits every variant alike."""
    for fn in variants.values():
        for _ in range(WARMUP_CALLS):
            fn(*args)
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside one sample would land on one variant only
    try:
        for r in range(repeat):
            for name in names[r % len(names):] + names[: r % len(names)]:
                t0 = time.perf_counter()
                variants[name](*args)
                samples[name].append(time.perf_counter() - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def copy_bandwidth(mib: int = 128, runs: int = 10) -> float:
    """GB/s of a large eager copy (bytes read + written): the memory ceiling of this machine."""
    src = torch.randn(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), (), runs)
    return 2 * src.numel() * 4 / seconds / 1e9


@dataclass
class KilnSummary:
    graphs: int = 0
    kernels: int = 0
    cache_hits: int = 0
    pass_seconds: float = 0.0
    aten_ops: list[str] = field(default_factory=list)  # op kinds kiln left to ATen
    aten_graphs: int = 0  # graphs kiln could not compile at all


class _WarningCounter(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "graph runs in ATen" in record.getMessage():
            self.count += 1


class KilnWatch:
    """Collects kiln's CompileReports (and whole graphs left to ATen) made inside a `with`."""

    def __enter__(self):
        from kiln.frontend.backend import REPORTS

        self._reports, self._start = REPORTS, len(REPORTS)
        self._handler = _WarningCounter()
        logging.getLogger("kiln").addHandler(self._handler)
        return self

    def __exit__(self, *exc):
        logging.getLogger("kiln").removeHandler(self._handler)
        self._new = self._reports[self._start:]

    def summary(self) -> KilnSummary:
        reports = self._new
        ops = sorted({op for r in reports for op in r.fallbacks})
        return KilnSummary(graphs=len(reports), kernels=sum(r.num_kernels for r in reports),
                           cache_hits=sum(r.cache_hits for r in reports),
                           pass_seconds=sum(r.seconds for r in reports), aten_ops=ops,
                           aten_graphs=self._handler.count)

    @property
    def reports(self) -> list:
        return list(self._new)

"""The cost model's units: a device's ceilings and the cost of one kernel or ATen call.

Every prediction is launch + max(bytes / copy rate, work / compute rate): a kernel is bound
by its memory traffic or by its arithmetic, whichever takes longer, plus the fixed cost of
starting it. On a CPU, bytes the last-level cache still holds move at the cache's copy rate,
the rest at memory's. Pure functions of their inputs: nothing here runs a kernel.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field

import torch

from kiln.ir.sizes import hint


@dataclass(frozen=True)
class Ceilings:
    """What a device does at best: each measured by runtime/ceilings.py, or given (tests)."""

    device: str  # what the rates were measured on ("cpu: <model>", "cuda: NVIDIA H200")
    copy_bytes_per_s: float  # bytes read + written a second by a large device copy
    ops_per_s: float  # simple element-wise operations a second (one op on one element)
    matmul_flop_per_s: float
    launch_s: float  # the fixed cost of one ATen call (eager's ops, kiln's ATen calls)
    kernel_launch_s: float  # the fixed cost of one of kiln's kernels
    row_cache_bytes: int  # where a kernel's re-read rows stay between its loop stages (0: nowhere)
    # writing memory the allocator has just mapped (a CPU's page faults): seconds a byte, for
    # buffers of at least fresh_alloc_bytes (smaller ones reuse freed memory); 0 on GPUs
    first_touch_s_per_byte: float = 0.0
    fresh_alloc_bytes: int = 0
    # a kernel's fixed time on the device when the host launches it while earlier work runs
    # (a GPU's stream): the host's launch cost then overlaps the device's work instead of adding
    # to it. 0: the host runs each kernel itself (a CPU), so launch and work add up
    queued_kernel_s: float = 0.0
    # bytes read + written a second by a copy whose working set (cache_bytes or less) the last
    # level cache holds (a CPU's); 0: every byte moves at copy_bytes_per_s (GPUs)
    cache_copy_bytes_per_s: float = 0.0
    cache_bytes: int = 0
    fn_cost: dict = field(default_factory=dict, compare=False)  # measured FN_COST (function -> ops)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> Ceilings:
        return Ceilings(**{f: data[f] for f in Ceilings.__dataclass_fields__})  # KeyError if one is missing

    @staticmethod
    def for_device(device: torch.device | str) -> Ceilings:
        """This device's ceilings: from the cache file, else measured once and cached."""
        from kiln.runtime.ceilings import ceilings_for

        return ceilings_for(torch.device(device))


# The cost of one element-wise function in simple operations (an add, a compare), by device
# type, where the ceilings did not measure it (runtime/ceilings.py measures the common ones
# through kiln's own C++ kernels, glibc's vector math: 15-50 chained adds; a function it did
# not measure then costs as the measured exp, or div, of its row); on GPUs a math function is
# a few instructions. The CPU's row is in units of a whole add kernel (an eager add's rate),
# for ceilings whose probes did not build.
_MATH_FNS = ("exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan atan2 sinh cosh tanh "
             "asinh acosh atanh erf erfc erfinv lgamma digamma pow sigmoid gelu").split()
_SLOW_FNS = "div sqrt rsqrt reciprocal fmod remainder floor_divide".split()
FN_COST = {
    "cpu": {**{f: 6.0 for f in _MATH_FNS}, **{f: 2.0 for f in _SLOW_FNS}, "gather": 4.0},
    "cuda": {**{f: 4.0 for f in _MATH_FNS}, **{f: 2.0 for f in _SLOW_FNS}, "gather": 1.0},
}


def device_type(ceilings: Ceilings) -> str:
    return ceilings.device.split(":")[0]


def function_cost(fn: str, ceilings: Ceilings) -> float:
    """Measured where the ceilings measured it (runtime/ceilings.py), else as the measured
    function of its kind (exp for math functions, div for the slow ones), else the table's.
    A reduction step is keyed "reduce.<kind>"."""
    if fn in ceilings.fn_cost:
        return ceilings.fn_cost[fn]
    like = "exp" if fn in _MATH_FNS else "div" if fn in _SLOW_FNS else None
    if like in ceilings.fn_cost:
        return ceilings.fn_cost[like]
    return FN_COST.get(device_type(ceilings), {}).get(fn, 1.0)


@dataclass(frozen=True)
class Cost:
    """One kernel or ATen call: `must_move` is every buffer it reads read once and every
    buffer it writes written once; `moves` adds what it reads again."""

    name: str
    must_move: int  # bytes
    moves: int  # bytes
    flops: float
    launches: int
    seconds: float  # predicted
    floor_s: float  # the roofline: the bytes that must move or the arithmetic, whichever is longer
    bound: str  # "memory", "compute", "matmul" or "launch": what the prediction is made of
    busy_s: float = 0.0  # the device's work alone: no launch, no fixed cost


def predict(name: str, must_move: int, moves: int, flops: float, work: float, launch_s: float,
             ceilings: Ceilings, rate: float, compute_bound: str, cached: int | None = None) -> Cost:
    """cached: the bytes of `moves` the last-level cache holds (None: all of them where the
    working set, must_move, fits it; none otherwise)."""
    if cached is None:
        cached = moves if fits_cache(must_move, ceilings) else 0
    memory_s = memory_seconds(moves, cached, ceilings)
    compute_s = work / rate
    busy = max(memory_s, compute_s)
    seconds = with_launch(launch_s, busy, ceilings)
    bound = "launch" if is_launch_bound(launch_s, busy, ceilings) else (
        "memory" if memory_s >= compute_s else compute_bound)
    floor_s = max(memory_seconds(must_move, min(cached, must_move), ceilings), compute_s)
    return Cost(name, must_move, moves, flops, 1, seconds, floor_s, bound, busy)


def fits_cache(nbytes: int, ceilings: Ceilings) -> bool:
    """Whether a working set of nbytes stays in the last-level cache (a CPU's)."""
    return bool(ceilings.cache_copy_bytes_per_s) and nbytes <= ceilings.cache_bytes


def memory_seconds(moves: int, cached: int, ceilings: Ceilings) -> float:
    """The time of moving `moves` bytes, `cached` of them to and from the last-level cache."""
    if not ceilings.cache_copy_bytes_per_s:
        return moves / ceilings.copy_bytes_per_s
    return cached / ceilings.cache_copy_bytes_per_s + (moves - cached) / ceilings.copy_bytes_per_s


def with_launch(launch_s: float, busy: float, ceilings: Ceilings) -> float:
    """A launch's time: the host's launch cost and the device's work add up where the host runs
    the kernel; where launches are queued, the longer of the host's launch and the device's."""
    if ceilings.queued_kernel_s:
        return max(launch_s, ceilings.queued_kernel_s + busy)
    return launch_s + busy


def is_launch_bound(launch_s: float, busy: float, ceilings: Ceilings) -> bool:
    return launch_s > busy + ceilings.queued_kernel_s


def first_touch(c: Cost, fresh_bytes: int, ceilings: Ceilings) -> Cost:
    """A kernel's cost when it is the first to write fresh_bytes of newly mapped memory."""
    if not fresh_bytes:
        return c
    return dataclasses.replace(c, seconds=c.seconds + fresh_bytes * ceilings.first_touch_s_per_byte)


def numel_hint(shape) -> int:
    """A shape's elements at a shape family's traced example (sizes.hint), which (unlike int()
    of a torch.SymInt) adds no guard: an estimate must never specialize a graph."""
    return math.prod(hint(s) for s in shape)


# A GPU's ceilings where none were measured (compiles do not time the device): an H200's.
NOMINAL_GPU = Ceilings("cuda: nominal (H200)", 4.25e12, 4.0e13, 7.0e14, 5e-6, 3e-6, 58 << 10,
                       queued_kernel_s=1e-6)




# A CPU's ceilings where none were measured: those of a 2-core AVX-512 Xeon (docs/benchmarks.md).
NOMINAL_CPU = Ceilings("cpu: nominal (2-core AVX-512 Xeon)", 3.0e10, 1.7e12, 4.0e11, 2e-6, 1e-6, 2 << 20,
                       cache_copy_bytes_per_s=6.0e10, cache_bytes=64 << 20,
                       fn_cost={"exp": 85.0, "log": 95.0, "tanh": 145.0, "erf": 350.0, "gelu": 430.0,
                                "sigmoid": 145.0, "sin": 105.0, "cos": 100.0, "sqrt": 105.0, "div": 75.0,
                                "pow": 1100.0, "reduce.sum": 1.0, "reduce.max": 830.0, "reduce.min": 830.0,
                                "gather": 310.0})


def dtype_text(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")

"""The device's ceilings for the cost model (passes/roofline.py): measured once per device and
torch version, kept in one small JSON file in kiln's cache directory. A file that cannot be
read or parsed is measured again and rewritten."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Callable

import torch

from kiln.passes.roofline import Ceilings

log = logging.getLogger("kiln")

FILE_NAME = "ceilings-3.json"  # numbered anew when the probes change what they measure
_in_process: dict[str, Ceilings] = {}


def device_key(device: torch.device) -> str:
    """What the ceilings depend on: the device's model and torch's version."""
    return f"{device_name(device)} | torch {torch.__version__}"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    from kiln.runtime.cache import cpu_model

    model = cpu_model().split(":", 1)[-1].strip()
    return f"cpu: {model[:80]} x{torch.get_num_threads()} threads"


def known_ceilings(device: torch.device) -> Ceilings | None:
    """The ceilings of device if this process or kiln's cache has them, without measuring: a
    user's compile must not spend seconds timing the machine."""
    key = device_key(device)
    if key in _in_process:
        return _in_process[key]
    from kiln.runtime.cache import cache_root

    found = _read(Path(cache_root()) / FILE_NAME).get(key)
    try:
        ceilings = Ceilings.from_dict(found) if isinstance(found, dict) else None
    except (KeyError, TypeError):
        return None
    if ceilings is not None:
        _in_process[key] = ceilings
    return ceilings


def ceilings_for(device: torch.device, folder: Path | None = None,
                 measure: Callable[[torch.device], Ceilings] | None = None) -> Ceilings:
    """The ceilings of device: from this process, else the cache file, else measured (and
    written back). folder: the cache directory (default kiln's); measure: for tests."""
    key = device_key(device)
    if folder is None and key in _in_process:
        return _in_process[key]
    if folder is None:
        from kiln.runtime.cache import cache_root

        folder = cache_root()
    path = Path(folder) / FILE_NAME
    table = _read(path)
    found = table.get(key)
    try:
        ceilings = Ceilings.from_dict(found) if isinstance(found, dict) else None
    except (KeyError, TypeError):
        ceilings = None
    if ceilings is None:
        ceilings = (measure or measure_ceilings)(device)
        table[key] = ceilings.to_dict()
        _write(path, table)
    _in_process[key] = ceilings
    return ceilings


def forget(device: torch.device, folder: Path | None = None) -> None:
    """Drop device's ceilings from this process and the cache file: the next use measures them."""
    key = device_key(device)
    _in_process.pop(key, None)
    if folder is None:
        from kiln.runtime.cache import cache_root

        folder = cache_root()
    path = Path(folder) / FILE_NAME
    table = _read(path)
    if table.pop(key, None) is not None:
        _write(path, table)


def _read(path: Path) -> dict:
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.info("kiln: the ceilings file %s is unreadable (%s); measuring again", path, e)
        return {}
    return table if isinstance(table, dict) else {}


def _write(path: Path, table: dict) -> None:
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(json.dumps(table, indent=1, sort_keys=True))
        os.replace(temp, path)
    except OSError as e:  # kept for this process only
        log.info("kiln: cannot write the ceilings file %s (%s)", path, e)


# --- measuring ------------------------------------------------------------------------------


def _best_seconds(fn: Callable[[], None], device: torch.device, repeat: int, inner: int = 1) -> float:
    """The fastest of `repeat` timings of `inner` calls of fn, per call (the least disturbed
    by other load on the machine); CUDA events on a GPU."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            seconds = time.perf_counter() - t0
        best = min(best, seconds / inner)
    return best


# programs resident on one GPU multiprocessor whose rows share the L2 between their stages
_ROWS_PER_SM = 8


def _row_cache_bytes(device: torch.device) -> int:
    """Where a kernel's re-read rows stay between its stages. A CPU thread's: its core's L2
    (sysfs), 1 MiB where unknown. A GPU program's: its share of the L2 among the programs
    resident at once, which read their rows again before other rows evict them."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", 0) or (8 << 20)
        return l2 // (props.multi_processor_count * _ROWS_PER_SM)
    if device.type != "cpu":
        return 0
    return _cpu_cache_bytes(2) or 1 << 20


def _cpu_cache_bytes(level: int) -> int:
    """The size of cpu0's data or unified cache of that level (sysfs), 0 where unknown."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            if int((index / "level").read_text()) != level or kind == "Instruction":
                continue
            text = (index / "size").read_text().strip()
            return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        except (OSError, ValueError, KeyError):
            continue
    return 0


# sizes per device type: a copy far beyond the caches, an op on data inside them, a matmul
# large enough to reach the library's rate
_SIZES = {
    "cpu": dict(copy_bytes=128 << 20, op_elements=1 << 16, matmul=1024, matmul_dtype=torch.float32),
    "cuda": dict(copy_bytes=1 << 30, op_elements=1 << 22, matmul=8192, matmul_dtype=torch.bfloat16),
}


def _gpu_issue_rate(device: torch.device) -> float:
    """Element operations a second on a GPU: one instruction per scheduler (4 an SM) per cycle,
    a warp's lanes each. Not timed: every eager element-wise kernel is bound by memory there,
    so no eager op shows the rate at which a fused kernel computes."""
    props = torch.cuda.get_device_properties(device)
    clock_hz = (getattr(props, "clock_rate", 0) or 1_500_000) * 1e3  # kHz; 1.5 GHz where unknown
    return props.multi_processor_count * 4 * props.warp_size * clock_hz


# the smallest kernel of kiln's C++ form: one OpenMP parallel loop, called through ctypes
_LAUNCH_PROBE = """extern "C" void kiln_probe_launch(float* __restrict__ out0) {
  #pragma omp parallel for
  for (int64_t x0 = 0; x0 < 64; ++x0) {
    out0[x0] = (float)x0;
  }
}
"""


def _cpp_launch_seconds(fallback: float) -> float:
    """What launching one of kiln's C++ kernels costs (less than an ATen op's dispatch);
    fallback where the probe does not build."""
    from kiln.runtime import cpp_build

    try:
        (probe,) = cpp_build.build_all([(_LAUNCH_PROBE, "kiln_probe_launch", 1)])
    except Exception as e:  # noqa: BLE001 - a ceiling, not part of any program
        log.info("kiln: the launch probe did not build (%s); using an ATen op's launch cost", e)
        return fallback
    out = torch.empty(64)
    address = out.data_ptr()
    return _best_seconds(lambda: probe.fn(address), torch.device("cpu"), repeat=5, inner=200)


# glibc maps allocations from this size up afresh each time (its largest mmap threshold): the
# first write of each page faults. Smaller buffers come back from freed memory.
FRESH_ALLOC_BYTES = 32 << 20


def _first_touch_seconds() -> float:
    """What the page faults of first writing FRESH_ALLOC_BYTES of new memory cost: a fill of
    a new buffer less a fill of one already written. The new buffers are kept until the
    timings end: returning their pages to the system is not part of a kernel's time."""
    cpu = torch.device("cpu")
    written = torch.empty(FRESH_ALLOC_BYTES // 4)
    written.fill_(0.0)
    refill = _best_seconds(lambda: written.fill_(1.0), cpu, repeat=3)
    held: list[torch.Tensor] = []
    fresh = _best_seconds(lambda: held.append(torch.empty(FRESH_ALLOC_BYTES // 4).fill_(1.0)), cpu, repeat=3)
    return max(fresh - refill, 0.0)


# functions whose cost in simple ops is measured on a CPU (libm's scalar code, as kiln calls it)
MEASURED_FNS = ("exp", "log", "tanh", "erf", "gelu", "sigmoid", "sin", "cos", "sqrt", "div", "pow")
_PROBE_ELEMENTS = 1 << 16  # 256 kB a buffer: in the caches


_CHAIN = 9  # simple ops one after another on each element: their time per op is arithmetic's


def _probe_kernel(fn: str, chain: int = 1):
    """Kernel IR of out0[x0] = fn(in0[x0]) (or fn(in0, in0) for two operands); chain > 1:
    fn applied that many times, each to the last one's result (and in0)."""
    from kiln.ir.index import Sym, sym
    from kiln.ir.kernel import Compute, Kernel, Load, Param, Stage, Store

    f32 = torch.float32
    x0 = sym("x0", _PROBE_ELEMENTS)
    body: list = [Load("a", "in0", x0, f32)]
    last = "a"
    for i in range(chain):
        operands = (last, "a") if fn in ("div", "pow", "add") else (last,)
        body.append(Compute(f"b{i}", fn, operands, f32))
        last = f"b{i}"
    body.append(Store("out0", x0, last, f32))
    name = f"kiln_probe_{fn}" + (f"{chain}" if chain > 1 else "")
    return Kernel(name, (Sym("x0", _PROBE_ELEMENTS),), (),
                  (Param("in0", f32, False), Param("out0", f32, True)), (Stage(False, tuple(body)),))


REDUCTIONS = ("sum", "max", "min")  # whose steps are timed (a max does not vectorize as a sum does)
_ROW = 1024  # the reduction probes' row


def _probe_reduction(kind: str):
    """Kernel IR of out0[x0] = reduce.kind over in0's row x0."""
    from kiln.ir.index import Sym, sym
    from kiln.ir.kernel import Kernel, Load, Param, Reduce, Stage, Store

    f32, rows = torch.float32, _PROBE_ELEMENTS // _ROW
    x0, r0 = sym("x0", rows), sym("r0", _ROW)
    stages = (Stage(True, (Load("a", "in0", x0 * _ROW + r0, f32), Reduce("s", kind, "a", f32))),
              Stage(False, (Store("out0", x0, "s", f32),)))
    return Kernel(f"kiln_probe_reduce_{kind}", (Sym("x0", rows),), (Sym("r0", _ROW),),
                  (Param("in0", f32, False), Param("out0", f32, True)), stages)


def _probe_gather():
    """Kernel IR of out0[x0] = in0[in1[x0]]: a table in the caches read at an index loaded
    at every element (in1 holds a permutation), as a gather through a loaded index runs."""
    from kiln.ir.index import Sym, as_expr, sym
    from kiln.ir.kernel import Kernel, Load, Param, Stage, Store

    f32, x0 = torch.float32, sym("x0", _PROBE_ELEMENTS)
    body = (Load("i", "in1", x0, torch.int64), Load("a", "in0", as_expr(Sym("i", _PROBE_ELEMENTS)), f32),
            Store("out0", x0, "a", f32))
    return Kernel("kiln_probe_gather", (Sym("x0", _PROBE_ELEMENTS),), (),
                  (Param("in0", f32, False), Param("in1", torch.int64, False), Param("out0", f32, True)),
                  (Stage(False, body),))


def _cpp_fn_costs() -> tuple[float, dict[str, float]]:
    """The seconds of one simple op (an add) on one element in kiln's C++ kernels, on all
    threads, and each MEASURED_FNS function's time in simple ops; (0, {}) where the probes do
    not build. An op's time is arithmetic's alone: a chain of _CHAIN adds per element less a
    single add, on data in the caches (the loads and stores are the memory term's); a
    function's is its kernel's time less the single add's, a reduction step's (keyed
    "reduce.<kind>") its row reduction's time an element less the single add's, and a
    gather's (keyed "gather") the gather probe's time an element less the single add's."""
    from kiln.codegen import cpp
    from kiln.runtime import cpp_build

    try:
        kernels = [_probe_kernel("add"), _probe_kernel("add", _CHAIN), *map(_probe_kernel, MEASURED_FNS),
                   *map(_probe_reduction, REDUCTIONS)]
        gather = _probe_gather()
        *built, built_gather = cpp_build.build_all([(cpp.render_kernel(k), k.name, 2) for k in kernels]
                                                   + [(cpp.render_kernel(gather), gather.name, 3)])
    except Exception as e:  # noqa: BLE001 - a ceiling, not part of any program
        log.info("kiln: the math probes did not build (%s); using the cost table", e)
        return 0.0, {}
    src = torch.rand(_PROBE_ELEMENTS) + 0.5
    out = torch.empty_like(src)
    args = (src.data_ptr(), out.data_ptr())
    permutation = torch.randperm(_PROBE_ELEMENTS)
    gather_args = (src.data_ptr(), permutation.data_ptr(), out.data_ptr())
    cpu, threads = torch.device("cpu"), torch.get_num_threads()
    # on one thread: a parallel region waits for its slowest thread, which on a busy machine
    # may wait out another process's time slice; the rate then scales with the threads
    torch.set_num_threads(1)
    try:
        add, chain, *fns = [_best_seconds(lambda b=b: b.fn(*args), cpu, repeat=5, inner=20) for b in built]
        fns.append(_best_seconds(lambda: built_gather.fn(*gather_args), cpu, repeat=5, inner=20))
    finally:
        torch.set_num_threads(threads)
    op = max(chain - add, add / 10) / (_CHAIN - 1)
    names = (*MEASURED_FNS, *(f"reduce.{kind}" for kind in REDUCTIONS), "gather")
    return op / threads / _PROBE_ELEMENTS, {
        fn: round(max(1.0 + (s - add) / op, 1.0), 2) for fn, s in zip(names, fns)}


# kiln's C++ copy, for the copy rate of data in the last-level cache
_COPY_PROBE = """extern "C" void kiln_probe_copy(const float* __restrict__ in0, float* __restrict__ out0,
                                int64_t n) {
  #pragma omp parallel for simd
  for (int64_t x0 = 0; x0 < n; ++x0) {
    out0[x0] = in0[x0];
  }
}
"""


# a cache level counts where a copy inside it runs at least this much faster than one from memory
CACHE_SPEEDUP = 2.0


def _cache_copy(fallback: float) -> tuple[int, float]:
    """A working set the last-level cache holds, and the rate (bytes read + written a second)
    at which kiln's C++ copy moves it there; (0, fallback) where no size is found or the probe
    does not build. The size reported for the cache may be a whole host's, shared with other
    machines (a virtual machine's): from half of it down to twice the L2, the largest working
    set copied CACHE_SPEEDUP times faster than from memory is the one taken. Each probe's
    source is written by another op just before it is copied, as a kernel's input is by the
    kernel before it."""
    from kiln.runtime import cpp_build

    l2 = _cpu_cache_bytes(2) or 1 << 20
    llc = max(_cpu_cache_bytes(3), l2)
    try:
        (probe,) = cpp_build.build_all([(_COPY_PROBE, "kiln_probe_copy", (2, 1))])
    except Exception as e:  # noqa: BLE001 - a ceiling, not part of any program
        log.info("kiln: the copy probe did not build (%s); one copy rate for every size", e)
        return 0, fallback
    working_set = llc // 2
    while working_set >= 2 * l2:
        rate = _copy_rate(probe, working_set)
        if rate >= CACHE_SPEEDUP * fallback:
            return working_set, rate
        working_set //= 2
    return 0, fallback


def _copy_rate(probe, working_set: int) -> float:
    """Bytes read + written a second by the copy probe over working_set bytes: on one thread
    (as the math probes), scaled by the threads."""
    src = torch.empty(working_set // 8)
    dst = torch.empty_like(src)
    args = (src.data_ptr(), dst.data_ptr(), src.numel())
    best, threads = math.inf, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(10):
            src.fill_(float(i))
            t0 = time.perf_counter()
            probe.fn(*args)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return working_set / best * threads


def _queued_kernel_seconds(one: torch.Tensor, kernels: int = 100) -> float:
    """A tiny kernel's time on a GPU when the launches are queued ahead of the device: a CUDA
    graph of `kernels` of them, replayed, per kernel. Its launches cost the host nothing then."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        one.add_(0.0)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(kernels):
                one.add_(0.0)
    torch.cuda.current_stream().wait_stream(stream)
    return _best_seconds(graph.replay, one.device, repeat=5) / kernels


def _copy_seconds(nbytes: int, device: torch.device) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return _best_seconds(lambda: dst.copy_(src), device, repeat=5)


def measure_ceilings(device: torch.device) -> Ceilings:
    """Time a large copy, a simple element-wise op on data in the caches (CPU), a matmul and a
    tiny op (the cost of one launch) on device; on a CPU also kiln's own kernels: their launch,
    arithmetic, math functions, reduction steps and a copy within the last-level cache. About a
    second on a CPU once the probes are built."""
    # a compile measures them: outside its fake and functional tensor modes
    with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
        return _measure(device)


def _measure(device: torch.device) -> Ceilings:
    sizes = _SIZES["cuda" if device.type == "cuda" else "cpu"]
    copy_s = _copy_seconds(sizes["copy_bytes"], device)
    a = torch.rand(sizes["op_elements"], device=device)
    b, c = torch.rand_like(a), torch.empty_like(a)
    op_s = _best_seconds(lambda: torch.add(a, b, out=c), device, repeat=5, inner=20)
    n, dtype = sizes["matmul"], sizes["matmul_dtype"]
    x = torch.randn(n, n, dtype=dtype, device=device)
    y, z = torch.randn_like(x), torch.empty_like(x)
    mm_s = _best_seconds(lambda: torch.mm(x, y, out=z), device, repeat=3)
    one = torch.ones(1, device=device)
    launch_s = _best_seconds(lambda: one.add_(0.0), device, repeat=5, inner=200)
    queued_s = _queued_kernel_seconds(one) if device.type == "cuda" else 0.0
    copied = 2 * sizes["copy_bytes"]
    ceilings = Ceilings(
        device=device_name(device),
        copy_bytes_per_s=copied / copy_s,
        ops_per_s=sizes["op_elements"] / max(op_s - launch_s, op_s / 10),
        matmul_flop_per_s=2.0 * n**3 / mm_s,
        launch_s=launch_s,
        kernel_launch_s=launch_s,
        row_cache_bytes=_row_cache_bytes(device),
        queued_kernel_s=queued_s,
    )
    if device.type == "cuda":
        return dataclasses.replace(ceilings, ops_per_s=_gpu_issue_rate(device))
    return _with_cpp_kernels(ceilings)


def _with_cpp_kernels(ceilings: Ceilings) -> Ceilings:
    """A CPU's ceilings as kiln's own C++ kernels see them: their launch, their element-wise
    rate and math functions (an eager op's rate differs), and the page faults of new memory."""
    kernel_launch_s = _cpp_launch_seconds(ceilings.launch_s)
    op_s, fn_cost = _cpp_fn_costs()
    ops_per_s = 1.0 / op_s if op_s else ceilings.ops_per_s
    touch_s = _first_touch_seconds()
    cache_bytes, cache_rate = _cache_copy(ceilings.copy_bytes_per_s)
    return dataclasses.replace(ceilings, kernel_launch_s=kernel_launch_s, ops_per_s=ops_per_s,
                               fn_cost=fn_cost, first_touch_s_per_byte=touch_s / FRESH_ALLOC_BYTES,
                               fresh_alloc_bytes=FRESH_ALLOC_BYTES, cache_bytes=cache_bytes,
                               cache_copy_bytes_per_s=cache_rate if cache_bytes else 0.0)

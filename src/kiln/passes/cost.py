"""What a compiled graph costs: bytes, FLOPs, launches and a predicted time for each kernel
and ATen call, against eager's op-by-op execution of the same graph, from the device's
ceilings (measured once per device by runtime/ceilings.py, or given).

Every prediction is launch + max(bytes / copy rate, work / compute rate): a kernel is bound
by its memory traffic or by its arithmetic, whichever takes longer, plus the fixed cost of
starting it. On a CPU, bytes the last-level cache still holds move at the cache's copy rate,
the rest at memory's. Pure functions of their inputs: nothing here runs a kernel.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from kiln.ir.index import Expr
from kiln.ir.kernel import Compute, Kernel, Load, Reduce, Store
from kiln.ir.sizes import hint

log = logging.getLogger("kiln")

BREAK_EVEN_LIMIT = 10_000  # calls: a graph that pays back later than this is logged


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
    "cpu": {**{f: 6.0 for f in _MATH_FNS}, **{f: 2.0 for f in _SLOW_FNS}},
    "cuda": {**{f: 4.0 for f in _MATH_FNS}, **{f: 2.0 for f in _SLOW_FNS}},
}


def _device_type(ceilings: Ceilings) -> str:
    return ceilings.device.split(":")[0]


def _fn_cost(fn: str, ceilings: Ceilings) -> float:
    """Measured where the ceilings measured it (runtime/ceilings.py), else as the measured
    function of its kind (exp for math functions, div for the slow ones), else the table's.
    A reduction step is keyed "reduce.<kind>"."""
    if fn in ceilings.fn_cost:
        return ceilings.fn_cost[fn]
    like = "exp" if fn in _MATH_FNS else "div" if fn in _SLOW_FNS else None
    if like in ceilings.fn_cost:
        return ceilings.fn_cost[like]
    return FN_COST.get(_device_type(ceilings), {}).get(fn, 1.0)


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


def _predict(name: str, must_move: int, moves: int, flops: float, work: float, launch_s: float,
             ceilings: Ceilings, rate: float, compute_bound: str, cached: int | None = None) -> Cost:
    """cached: the bytes of `moves` the last-level cache holds (None: all of them where the
    working set, must_move, fits it; none otherwise)."""
    if cached is None:
        cached = moves if fits_cache(must_move, ceilings) else 0
    memory_s = _memory_s(moves, cached, ceilings)
    compute_s = work / rate
    busy = max(memory_s, compute_s)
    seconds = _with_launch(launch_s, busy, ceilings)
    bound = "launch" if _launch_bound(launch_s, busy, ceilings) else (
        "memory" if memory_s >= compute_s else compute_bound)
    floor_s = max(_memory_s(must_move, min(cached, must_move), ceilings), compute_s)
    return Cost(name, must_move, moves, flops, 1, seconds, floor_s, bound, busy)


def fits_cache(nbytes: int, ceilings: Ceilings) -> bool:
    """Whether a working set of nbytes stays in the last-level cache (a CPU's)."""
    return bool(ceilings.cache_copy_bytes_per_s) and nbytes <= ceilings.cache_bytes


def _memory_s(moves: int, cached: int, ceilings: Ceilings) -> float:
    """The time of moving `moves` bytes, `cached` of them to and from the last-level cache."""
    if not ceilings.cache_copy_bytes_per_s:
        return moves / ceilings.copy_bytes_per_s
    return cached / ceilings.cache_copy_bytes_per_s + (moves - cached) / ceilings.copy_bytes_per_s


def _with_launch(launch_s: float, busy: float, ceilings: Ceilings) -> float:
    """A launch's time: the host's launch cost and the device's work add up where the host runs
    the kernel; where launches are queued, the longer of the host's launch and the device's."""
    if ceilings.queued_kernel_s:
        return max(launch_s, ceilings.queued_kernel_s + busy)
    return launch_s + busy


def _launch_bound(launch_s: float, busy: float, ceilings: Ceilings) -> bool:
    return launch_s > busy + ceilings.queued_kernel_s


# --- kernels -------------------------------------------------------------------------------


def _elements(index: Expr, syms: dict[str, int], iterations: int) -> int:
    """Distinct elements an index touches over a stage of `iterations`: the product of the
    extents of the symbols it depends on (views without overlap map distinct points to
    distinct elements), and no more than one a iteration (an index read from memory, as an
    embedding's, is a symbol as wide as the table)."""
    n = 1
    for sym in index.symbols():
        n *= syms.get(sym.name) or _size(sym.extent or 1)
    return min(n, iterations)


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def kernel_cost(kernel: Kernel, ceilings: Ceilings, in_cache: frozenset[str] | None = None) -> Cost:
    """Bytes, FLOPs and predicted time of one launch of kernel.

    in_cache: the parameters whose buffers the last-level cache holds at the launch (a host
    program's order of launches tells, program_cost); None: all of them where the kernel's
    working set (must_move) fits the cache, none otherwise.

    Re-reads: a buffer loaded again in a later loop stage (a softmax reads its row for the max,
    again for the sum, again for the output) moves its row again, unless one row of every
    buffer the kernel re-reads fits in ceilings.row_cache_bytes, where the backend keeps rows
    between stages (a CPU thread's row stays in its core's L2; a GPU program's row stays in its
    share of the L2, or in registers).
    FLOPs: one per element-wise op or reduction step per iteration of its stage."""
    if getattr(kernel, "product", ""):  # a matmul template (ir/matmul.py)
        return matmul_template_cost(kernel, ceilings)
    members = getattr(kernel, "members", ())
    if members:  # a group (ir/group.py): its members' work, one launch
        parts = [kernel_cost(m, ceilings, in_cache) for m in members]
        busy = sum(c.busy_s for c in parts)
        seconds = _with_launch(ceilings.kernel_launch_s, busy, ceilings)
        bound = "launch" if _launch_bound(ceilings.kernel_launch_s, busy, ceilings) else parts[0].bound
        return Cost(kernel.name, sum(c.must_move for c in parts), sum(c.moves for c in parts),
                    sum(c.flops for c in parts), 1, seconds, sum(c.floor_s for c in parts), bound,
                    busy)
    scratch = {s.name for s in kernel.scratch}
    extents = {s.name: _size(s.extent or 1) for s in (*kernel.outer, *kernel.reduce)}
    reduce_names = {s.name for s in kernel.reduce}
    first_read: dict[str, int] = {}  # buffer -> bytes of its first reading stage
    again: dict[str, int] = {}  # buffer -> bytes of the stages that read it again
    row_bytes: dict[str, int] = {}  # buffer -> bytes of one row (re-read buffers)
    written: dict[str, int] = {}
    flops = work = 0.0
    for stage in kernel.stages:
        iterations = _size(kernel.outer_numel) * (_size(kernel.reduce_numel) if stage.loop else 1)
        stage_reads: dict[str, int] = {}
        for s in stage.body:
            if isinstance(s, Load) and s.buf not in scratch:
                size = _elements(s.index, extents, iterations) * _itemsize(s.dtype)
                stage_reads[s.buf] = max(stage_reads.get(s.buf, 0), size)
                row = {**{n: 1 for n in extents}, **{n: extents[n] for n in reduce_names}}
                row_bytes[s.buf] = _elements(s.index, row, _size(kernel.reduce_numel)) * _itemsize(s.dtype)
            elif isinstance(s, Store) and s.buf not in scratch:
                size = _elements(s.index, extents, iterations) * _itemsize(s.dtype)
                written[s.buf] = max(written.get(s.buf, 0), size)
            elif isinstance(s, Compute):
                flops += iterations
                work += iterations * _fn_cost(s.fn, ceilings)
            elif isinstance(s, Reduce):
                flops += iterations
                if s.kind == "expsum":  # an exp and a subtraction per element besides the sum
                    flops += 2 * iterations
                    work += iterations * (_fn_cost("reduce.sum", ceilings) + 1 + _fn_cost("exp", ceilings))
                else:
                    work += iterations * _fn_cost(f"reduce.{s.kind}", ceilings)
        for buf, size in stage_reads.items():
            if buf in first_read:
                again[buf] = again.get(buf, 0) + size
            else:
                first_read[buf] = size
    must_move = sum(first_read.values()) + sum(written.values())
    rows_fit = sum(row_bytes[b] for b in again) <= ceilings.row_cache_bytes
    moves = must_move + (0 if rows_fit else sum(again.values()))
    cached = None
    if in_cache is not None:
        cached = sum(first_read.get(b, 0) + written.get(b, 0) + (0 if rows_fit else again.get(b, 0))
                     for b in in_cache)
    return _predict(kernel.name, must_move, moves, flops, work, ceilings.kernel_launch_s, ceilings,
                    ceilings.ops_per_s, "compute", cached)


def touched_bytes(kernel: Kernel) -> dict[str, int]:
    """The bytes of each buffer parameter one launch of kernel reads or writes, each once
    (a gather's table: the rows it reads, not the whole table); {} for a group or a template."""
    if getattr(kernel, "product", "") or getattr(kernel, "members", ()):
        return {}
    scratch = {s.name for s in kernel.scratch}
    extents = {s.name: _size(s.extent or 1) for s in (*kernel.outer, *kernel.reduce)}
    touched: dict[str, int] = {}
    for stage in kernel.stages:
        iterations = _size(kernel.outer_numel) * (_size(kernel.reduce_numel) if stage.loop else 1)
        for s in stage.body:
            if isinstance(s, (Load, Store)) and s.buf not in scratch:
                size = _elements(s.index, extents, iterations) * _itemsize(s.dtype)
                touched[s.buf] = max(touched.get(s.buf, 0), size)
    return touched


# --- ATen calls (kiln's extern calls and eager's ops) -----------------------------------------


def _size(s) -> int:
    """A size as a number: a shape family's by its traced example, which (unlike int() of
    a torch.SymInt) adds no guard: an estimate must never specialize a graph."""
    return hint(s)


def _numel(shape) -> int:
    return math.prod(_size(s) for s in shape)


def _matmul_flops(args: list, out) -> float:
    """2MNK for a (batched) matmul: the output's elements times twice the shared dimension."""
    first = next(a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2)
    return 2.0 * _numel(out.shape) * _size(first.shape[-1])


def _addmm_flops(args: list, out) -> float:
    return 2.0 * _numel(out.shape) * _size(args[1].shape[-1])


def _attention_flops(args: list, out) -> float:
    """QK^T and PV: 4 * batch * heads * Lq * Lk * head dim."""
    q, k = args[0], args[1]
    return 4.0 * _numel(q.shape[:-2]) * _size(q.shape[-2]) * _size(k.shape[-2]) * _size(q.shape[-1])


# op name (an overload packet's) -> FLOPs from the call's tensors (meta or real) and result
MATMUL_FLOPS = {
    "mm": _matmul_flops, "bmm": _matmul_flops, "matmul": _matmul_flops, "addmm": _addmm_flops,
    "baddbmm": _addmm_flops, "_scaled_dot_product_flash_attention": _attention_flops,
    "_scaled_dot_product_flash_attention_for_cpu": _attention_flops,
    "_scaled_dot_product_efficient_attention": _attention_flops,
    "_scaled_dot_product_cudnn_attention": _attention_flops,
    "scaled_dot_product_attention": _attention_flops,
}


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _tensor_bytes(t: torch.Tensor) -> int:
    return _numel(t.shape) * t.element_size()


def op_name(op: Any) -> str:
    """The overload packet's name of an ATen op or qualified name ("aten::mm.default" -> "mm")."""
    text = op if isinstance(op, str) else getattr(op, "__name__", str(op))
    return text.split("::")[-1].split(".")[0]


def aten_cost(op: Any, args: list, out: Any, ceilings: Ceilings) -> Cost:
    """One ATen call as eager runs it: it reads its tensor arguments, writes its result."""
    name = op_name(op)
    reads = sum(_tensor_bytes(t) for t in _tensors(args))
    writes = sum(_tensor_bytes(t) for t in _tensors(out))
    matmul = MATMUL_FLOPS.get(name)
    outputs = _tensors(out)
    if matmul is not None and outputs:
        try:
            flops = matmul(args, outputs[0])
        except (IndexError, AttributeError, StopIteration, TypeError):
            flops = 0.0
        return _predict(name, reads + writes, reads + writes, flops, flops, ceilings.launch_s, ceilings,
                        ceilings.matmul_flop_per_s, "matmul")
    elements = sum(_numel(t.shape) for t in outputs)
    work = elements * _fn_cost(name, ceilings)
    c = _predict(name, reads + writes, reads + writes, float(elements), work, ceilings.launch_s, ceilings,
                 ceilings.ops_per_s, "compute")
    threshold = ceilings.fresh_alloc_bytes or math.inf
    return _first_touch(c, sum(n for n in map(_tensor_bytes, outputs) if n >= threshold), ceilings)


def launches_nothing(op: Any) -> bool:
    """Whether eager runs op without a kernel: a view or alias of its input (per its schema)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    returns = schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def eager_costs(gm: torch.fx.GraphModule, ceilings: Ceilings) -> list[Cost]:
    """Eager's op-by-op run of an ATen graph: one launch per op that computes (views are free),
    each reading its inputs and writing its result, from the shapes traced into the graph."""
    costs = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if launches_nothing(node.target):
            continue
        args = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
        args = [[x.meta.get("val") if isinstance(x, torch.fx.Node) else x for x in a]
                if isinstance(a, (list, tuple)) else a for a in args]
        costs.append(aten_cost(node.target, args, node.meta.get("val"), ceilings))
    return costs


# --- a graph ---------------------------------------------------------------------------------


@dataclass
class GraphCost:
    """kiln's program against eager's ops: kernels and ATen calls in the order they run."""

    kernels: list[Cost] = field(default_factory=list)  # one per launch
    aten: list[Cost] = field(default_factory=list)  # kiln's ATen calls
    eager: list[Cost] = field(default_factory=list)  # eager's ops (empty when not known)
    ceilings: Ceilings | None = None

    @property
    def launches(self) -> int:
        return sum(c.launches for c in self.kernels + self.aten)

    @property
    def moves(self) -> int:
        return sum(c.moves for c in self.kernels + self.aten)

    @property
    def flops(self) -> float:
        return sum(c.flops for c in self.kernels + self.aten)

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.kernels + self.aten)

    @property
    def eager_launches(self) -> int:
        return sum(c.launches for c in self.eager)

    @property
    def eager_moves(self) -> int:
        return sum(c.moves for c in self.eager)

    @property
    def eager_seconds(self) -> float:
        return sum(c.seconds for c in self.eager)

    @property
    def launch_bound(self) -> bool:
        """Whether the host's cost of launching the program's kernels and ATen calls one by one
        exceeds their work on the device."""
        if self.ceilings is None:
            return False
        launch = (sum(c.launches for c in self.kernels) * self.ceilings.kernel_launch_s
                  + sum(c.launches for c in self.aten) * self.ceilings.launch_s)
        return launch > sum(c.busy_s for c in self.kernels + self.aten)


@dataclass(frozen=True)
class BreakEven:
    """After how many calls compiling pays: compile seconds over the per-call saving."""

    compile_s: float
    saving_s: float  # per call; <= 0: never pays
    measured: bool  # the saving was measured (else predicted by the cost model)

    @property
    def calls(self) -> float:
        return self.compile_s / self.saving_s if self.saving_s > 0 else math.inf

    @property
    def pays(self) -> bool:
        return self.calls <= BREAK_EVEN_LIMIT

    def __str__(self) -> str:
        return self.text()

    def text(self, of: str = "") -> str:
        """One line; `of` names what the compile seconds cover."""
        how = "measured" if self.measured else "predicted"
        head = f"break-even{f' ({of})' if of else ''}:"
        if self.saving_s <= 0:
            return (f"{head} never (a call saves {self.saving_s * 1e6:.1f} us, {how}; "
                    f"compile {self.compile_s:.2f} s)")
        return (f"{head} after {math.ceil(self.calls):,} calls (compile {self.compile_s:.2f} s, "
                f"a call saves {self.saving_s * 1e6:.1f} us, {how})")


def break_even(compile_s: float, eager_s: float, compiled_s: float, measured: bool) -> BreakEven:
    return BreakEven(compile_s, eager_s - compiled_s, measured)


# --- kiln's program ---------------------------------------------------------------------------


def _meta(shape, stride, dtype) -> torch.Tensor:
    """A shape family's sizes at their traced examples (_size)."""
    shape, stride = tuple(map(_size, shape)), tuple(map(_size, stride))
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def _on_meta(value: Any, buffers: dict[str, Any], constants: dict[str, Any]) -> Any:
    from kiln.ir.host import ConstRef, Ref

    if isinstance(value, Ref):
        return buffers.get(value.name)
    if isinstance(value, ConstRef):
        const = constants.get(value.name)
        return const.to("meta") if isinstance(const, torch.Tensor) else const
    if isinstance(value, list):
        return [_on_meta(v, buffers, constants) for v in value]
    if isinstance(value, tuple):
        return tuple(_on_meta(v, buffers, constants) for v in value)
    if isinstance(value, torch.device):
        return torch.device("meta")
    return value


def _run_on_meta(ins, buffers: dict[str, Any], constants: dict[str, Any]) -> Any:
    """An ATen call's result on meta tensors (shapes and dtypes only), or None where the op
    cannot run there (a collective, a function no name resolves)."""
    from kiln.ir.host import resolve_op

    if not isinstance(ins.op, str):
        return None
    args = _on_meta(ins.args, buffers, constants)
    kwargs = {k: _on_meta(v, buffers, constants) for k, v in ins.kwargs}
    if "device" in kwargs:
        kwargs["device"] = torch.device("meta")
    try:
        return resolve_op(ins.op)(*args, **kwargs)
    except Exception:  # noqa: BLE001 - an op without a meta kernel costs nothing in the estimate
        return None


def program_cost(program, kernels: list[Kernel], ceilings: Ceilings,
                 eager: list[Cost] | None = None) -> GraphCost:
    """The cost of one call of a host program (ir/host.py): each launch at its kernel's cost,
    each ATen call as eager runs it (shapes found by running the program on meta tensors)."""
    from kiln.ir.host import (
        Alloc,
        CallAten,
        CopyMemory,
        EagerLayout,
        EnsureLayout,
        Item,
        Launch,
        Restride,
        View,
    )

    by_name = {k.name: k for k in kernels}
    buffers: dict[str, Any] = {s.name: _meta(s.shape, s.stride, s.dtype) for s in program.inputs}
    cost = GraphCost(eager=list(eager or []), ceilings=ceilings)
    fresh: dict[str, int] = {}  # newly mapped buffers not yet written
    memory = _Memory()
    launches: list[tuple[int, Kernel, dict[str, str], int]] = []  # cost.kernels' index, ...
    for ins in program.body:
        if isinstance(ins, Launch):
            if ins.kernel in by_name:
                kernel = by_name[ins.kernel]
                params = {p.name: a for p, a in zip(kernel.params, ins.args)}
                touched = touched_bytes(kernel)
                memory.step([(a, touched.get(p, _nbytes(buffers.get(a)))) for p, a in params.items()],
                            launch=True)
                fresh_bytes = sum(fresh.pop(w, 0) for w in ins.writes)
                launches.append((len(cost.kernels), kernel, params, fresh_bytes))
                cost.kernels.append(Cost(kernel.name, 0, 0, 0.0, 1, 0.0, 0.0, "launch"))  # below
        elif isinstance(ins, Alloc):
            buffers[ins.out] = _meta(ins.shape, ins.stride, ins.dtype)
            nbytes = _numel(ins.shape) * ins.dtype.itemsize
            memory.alloc(ins.out, ins.slot, nbytes >= (ceilings.fresh_alloc_bytes or math.inf))
            if ins.slot is None and ceilings.fresh_alloc_bytes and nbytes >= ceilings.fresh_alloc_bytes:
                fresh[ins.out] = nbytes
        elif isinstance(ins, (View, EnsureLayout, EagerLayout)):
            base = ins.base if isinstance(ins, View) else ins.src
            src = buffers.get(base)
            dtype = getattr(ins, "dtype", None) or (src.dtype if src is not None else torch.float32)
            buffers[ins.out] = _meta(ins.shape, ins.stride, dtype)
            memory.alias(ins.out, base)
        elif isinstance(ins, (Restride, CopyMemory)):
            src = buffers.get(ins.src)
            if src is not None:
                stride = ins.stride if isinstance(ins, Restride) else src.stride()
                buffers[ins.out] = _meta(src.shape, stride, src.dtype)
                cost.aten.append(aten_cost("copy", [src], buffers[ins.out], ceilings))
                memory.step([(ins.src, _nbytes(src)), (ins.out, _nbytes(src))])
        elif isinstance(ins, Item):
            src = buffers.get(ins.src)
            buffers[ins.out] = src[ins.index] if isinstance(src, (list, tuple)) else None
            memory.alias(ins.out, ins.src)
        elif isinstance(ins, CallAten):
            out = _run_on_meta(ins, buffers, program.constants)
            buffers[ins.out] = out
            refs = _refs((ins.args, ins.kwargs))
            memory.step([(r, _nbytes(buffers.get(r))) for r in refs] + [(ins.out, _nbytes(out))])
            if out is not None and not launches_nothing(_resolved(ins.op)):
                args = _on_meta(ins.args, buffers, program.constants)
                cost.aten.append(aten_cost(ins.op, list(args), out, ceilings))
    held = memory.held_at_launches(ceilings.cache_bytes) if ceilings.cache_copy_bytes_per_s else {}
    for n, (index, kernel, params, fresh_bytes) in enumerate(launches):
        in_cache = frozenset(p for p, a in params.items() if memory.memory(a) in held[n]) if held else None
        cost.kernels[index] = _first_touch(kernel_cost(kernel, ceilings, in_cache), fresh_bytes, ceilings)
    return cost


def _nbytes(value: Any) -> int:
    return sum(_tensor_bytes(t) for t in _tensors(value))


def _refs(value: Any) -> list[str]:
    """The names of the buffers a host instruction's arguments refer to."""
    from kiln.ir.host import Ref

    if isinstance(value, Ref):
        return [value.name]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _refs(v)]
    return []


class _Memory:
    """Which buffers a CPU's last-level cache holds when each of a host program's kernels
    starts: the cache keeps what was touched last, so a buffer is held where the bytes touched
    since its last use, and its own, fit the cache. Buffers are named by their memory (an
    arena slot, a view's base). The program runs call after call, so the previous call's steps
    come before the first ones, and a new buffer below the allocator's mmap threshold is the
    block the allocator handed out for it in the previous call; new pages mapped for a larger
    one are held by nothing."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # buffer -> its memory
        self.steps: list[tuple[list[tuple[str, int]], bool]] = []  # memory touched, bytes; a launch?
        self.mapped: set[str] = set()

    def memory(self, buf: str) -> str:
        return self.names.get(buf, buf)

    def alloc(self, buf: str, slot: int | None, mapped: bool) -> None:
        self.names[buf] = f"slot {slot}" if slot is not None else buf
        if slot is None and mapped:
            self.mapped.add(buf)

    def alias(self, buf: str, base: str) -> None:
        self.names[buf] = self.memory(base)

    def step(self, touched: list[tuple[str, int]], launch: bool = False) -> None:
        self.steps.append(([(self.memory(b), n) for b, n in touched], launch))

    def held_at_launches(self, capacity: int) -> list[set[str]]:
        """Per launch, in order: the memory (memory(buffer)) the cache holds as it starts."""
        recent: dict[str, int] = {}  # memory -> bytes, least recently touched first
        held: list[set[str]] = []
        for call in (0, 1):  # the first pass leaves what the previous call touched
            for touched, launch in self.steps:
                if launch and call:
                    held.append({mem for mem, n in touched if self._since(mem, recent) + n <= capacity})
                for mem, n in touched:
                    recent.pop(mem, None)
                    recent[mem] = n
        return held

    def _since(self, mem: str, recent: dict[str, int]) -> float:
        """The bytes touched since mem was last (inf: never, or newly mapped)."""
        if mem in self.mapped or mem not in recent:
            return math.inf
        since = 0
        for other in reversed(recent):  # most recent first
            if other == mem:
                return since
            since += recent[other]
        return math.inf


def _first_touch(c: Cost, fresh_bytes: int, ceilings: Ceilings) -> Cost:
    """A kernel's cost when it is the first to write fresh_bytes of newly mapped memory."""
    if not fresh_bytes:
        return c
    return dataclasses.replace(c, seconds=c.seconds + fresh_bytes * ceilings.first_touch_s_per_byte)


def _resolved(op: Any) -> Any:
    from kiln.ir.host import resolve_op

    try:
        return resolve_op(op) if isinstance(op, str) else op
    except Exception:  # noqa: BLE001 - unknown here: treated as computing
        return None


# --- after each compile -----------------------------------------------------------------------


def eager_before_passes(gm: torch.fx.GraphModule, device: torch.device) -> tuple[Ceilings, list[Cost]] | None:
    """The device's ceilings and eager's costs of gm, taken before kiln's passes rewrite gm;
    None where they cannot be had (the model's estimate never stops a compile)."""
    try:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None  # measuring the ceilings would launch kernels into the capture
        from kiln.runtime.ceilings import known_ceilings

        ceilings = known_ceilings(torch.device(device))  # kiln.explain measures them
        if ceilings is None:
            return None
        return ceilings, eager_costs(gm, ceilings)
    except Exception as e:  # noqa: BLE001 - an estimate, not part of the program
        log.debug("kiln: no cost estimate for this graph: %s: %s", type(e).__name__, e)
        return None


def after_compile(report, before: tuple[Ceilings, list[Cost]] | None) -> GraphCost | None:
    """The compiled program's cost against eager's; one log line where compiling it will not
    pay within BREAK_EVEN_LIMIT calls, by the predicted saving."""
    if before is None or report.host_program is None:
        return None
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    ceilings, eager = before
    try:
        with unset_fake_temporarily():  # meta tensors suffice: faking them again costs time
            cost = program_cost(report.host_program, report.kernels, ceilings, eager)
    except Exception as e:  # noqa: BLE001 - an estimate, not part of the program
        log.debug("kiln: no cost estimate for this graph: %s: %s", type(e).__name__, e)
        return None
    verdict = break_even(report.seconds, cost.eager_seconds, cost.seconds, measured=False)
    if not verdict.pays:
        log.info("kiln: a graph of %d kernels and %d ATen calls will not pay for its compile within "
                 "%s calls: %s", len(cost.kernels), len(cost.aten), f"{BREAK_EVEN_LIMIT:,}", verdict)
    return cost


def launch_bound(report) -> bool:
    """Whether launching the program's kernels one by one costs the host more than their work
    costs the device, at the traced sizes: by the graph's cost where it has one, else by a
    nominal GPU's ceilings (a compile does not time the device)."""
    if report.cost is not None:
        return report.cost.launch_bound
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        with unset_fake_temporarily():
            return program_cost(report.host_program, report.kernels, NOMINAL_GPU).launch_bound
    except Exception as e:  # noqa: BLE001 - an estimate: without one, nothing is padded
        log.debug("kiln: no launch estimate for this graph: %s: %s", type(e).__name__, e)
        return False


# --- matmul templates (ir/matmul.py) against cuBLAS and a separate epilogue kernel ------------

# The share of cuBLAS's rate the Triton template reaches on shapes that tile evenly (16-bit
# operands on Hopper), as timed on the H200 (docs/benchmarks.md): a template is chosen only
# where fusing saves more than that.
TEMPLATE_MATMUL_EFFICIENCY = 0.7
TEMPLATE_TILE = (128, 128, 64)  # M, N, K: the tiles of the template's configurations divide these
# A GPU's ceilings where none were measured (compiles do not time the device): an H200's.
NOMINAL_GPU = Ceilings("cuda: nominal (H200)", 4.25e12, 4.0e13, 7.0e14, 5e-6, 3e-6, 58 << 10,
                       queued_kernel_s=1e-6)


def _without_product(kernel) -> Kernel:
    """A matmul kernel's epilogue as a plain point-wise kernel, less its loads of the product."""
    stages = tuple(dataclasses.replace(st, body=tuple(s for s in st.body if not (
        isinstance(s, Load) and s.buf == kernel.product))) for st in kernel.stages)
    return Kernel(kernel.name, kernel.outer, (), kernel.params, stages)


def matmul_template_cost(kernel, ceilings: Ceilings, wave_share: float = 1.0) -> Cost:
    """One launch of a matmul template: the product at TEMPLATE_MATMUL_EFFICIENCY of the
    matmul rate, times the share of SMs its waves of tiles keep busy (from the backend, 1
    where not given), reading each operand once and what the epilogue reads, writing its
    stores."""
    epilogue = kernel_cost(_without_product(kernel), ceilings)
    operands = (kernel.m + kernel.n) * kernel.k * kernel.operand_dtype.itemsize
    must_move = epilogue.must_move + operands
    flops = 2.0 * kernel.m * kernel.n * kernel.k
    rate = ceilings.matmul_flop_per_s * TEMPLATE_MATMUL_EFFICIENCY * wave_share
    memory_s = must_move / ceilings.copy_bytes_per_s
    busy = max(memory_s, flops / rate, epilogue.busy_s)
    bound = "memory" if memory_s >= flops / rate else "matmul"
    floor_s = max(memory_s, flops / ceilings.matmul_flop_per_s)
    seconds = _with_launch(ceilings.kernel_launch_s, busy, ceilings)
    return Cost(kernel.name, must_move, must_move, flops + epilogue.flops, 1, seconds, floor_s, bound, busy)


@dataclass(frozen=True)
class MatmulChoice:
    """Template or cuBLAS for one matmul, with the predicted times behind it (seconds)."""

    template: bool
    reason: str
    template_s: float = 0.0
    cublas_s: float = 0.0  # the ATen matmul and the separate epilogue kernel


def choose_matmul(template, epilogue: Kernel | None, cublas: Cost, ceilings: Ceilings,
                  forced: bool, wave_share: float = 1.0) -> MatmulChoice:
    """template: the MatmulKernel that fusing would make; epilogue: the kernel it replaces
    (None: nothing reads the product but as a buffer); cublas: the ATen call's cost;
    wave_share: the share of SMs the template's waves of tiles keep busy (the backend's).
    The template pays where the epilogue's traffic (the product written, read back, and the
    second launch) outweighs what the template gives up to cuBLAS, on shapes it tiles evenly."""
    if forced:
        return MatmulChoice(True, "matmul templates forced on (option matmul_templates=True)")
    m, n, k = template.m, template.n, template.k
    tm, tn, tk = TEMPLATE_TILE
    if m % tm or n % tn or k % tk:
        return MatmulChoice(False, f"cuBLAS: {m} x {n} x {k} does not tile by {tm} x {tn} x {tk}, "
                                   "where the template would mask its edge tiles")
    if template.operand_dtype.itemsize > 2:
        return MatmulChoice(False, f"cuBLAS: {dtype_text(template.operand_dtype)} operands (eager's "
                                   "float32 matmul is IEEE float32, which tensor cores do not run)")
    if epilogue is None:
        return MatmulChoice(False, "cuBLAS: no element-wise epilogue reads the product")
    fused = matmul_template_cost(template, ceilings, wave_share).seconds
    separate = cublas.seconds + kernel_cost(epilogue, ceilings).seconds
    times = f"template {fused * 1e6:.1f} us, cuBLAS + epilogue kernel {separate * 1e6:.1f} us predicted"
    if wave_share < 0.9:
        times += f" (the template's tiles keep {wave_share:.0%} of the SMs busy)"
    if fused < separate:
        return MatmulChoice(True, f"template with the epilogue fused: {times}", fused, separate)
    return MatmulChoice(False, f"cuBLAS: {times}", fused, separate)


# Stack bytes a thread of a template may spill at its tile: a little spilling costs little, a
# heavy epilogue's spilling costs several times the template's predicted time
# (docs/matmul_templates.md).
TEMPLATE_SPILL_LIMIT = 256


def refuse_spilling(choice: MatmulChoice, spilled: int | None) -> MatmulChoice:
    """The template loses where its compiled epilogue spills registers past the limit: the
    cost model's rates assume a template that keeps its tile in registers."""
    if not choice.template or spilled is None or spilled <= TEMPLATE_SPILL_LIMIT:
        return choice
    return dataclasses.replace(
        choice, template=False,
        reason=f"cuBLAS: the template's epilogue spills {spilled} bytes a thread at its tile "
               f"(over {TEMPLATE_SPILL_LIMIT}); predicted {choice.reason}")


def dtype_text(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")

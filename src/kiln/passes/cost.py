"""What a compiled graph costs: bytes, FLOPs, launches and a predicted time for each kernel
and ATen call, against eager's op-by-op execution of the same graph (passes/aten_cost.py),
from the device's ceilings (passes/roofline.py; measured once per device by
runtime/ceilings.py, or given). Pure functions of their inputs: nothing here runs a kernel.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir.index import Expr, Sym
from kiln.ir.kernel import Compute, InBounds, IndexValue, Kernel, Load, Reduce, Store, column_reduction
from kiln.ir.matmul import loop_form
from kiln.ir.sizes import hint
from kiln.passes.aten_cost import (
    aten_cost,
    eager_costs,
    launches_nothing,
    resolved_op,
    tensor_bytes,
    tensors_in,
)
from kiln.passes.roofline import (
    NOMINAL_GPU,
    Ceilings,
    Cost,
    first_touch,
    fits_cache,
    function_cost,
    is_launch_bound,
    memory_seconds,
    numel_hint,
    predict,
    with_launch,
)

log = logging.getLogger("kiln")

BREAK_EVEN_LIMIT = 10_000  # calls: a graph that pays back later than this is logged


# --- kernels -------------------------------------------------------------------------------


def _elements(index: Expr, syms: dict[str, int], iterations: int) -> int:
    """Distinct elements an index touches over a stage of `iterations`: the product of the
    extents of the symbols it depends on (views without overlap map distinct points to
    distinct elements), and no more than one a iteration (an index read from memory, as an
    embedding's, is a symbol as wide as the table)."""
    n = 1
    for sym in index.symbols():
        n *= syms.get(sym.name) or hint(sym.extent or 1)
    return min(n, iterations)


def _masked_extents(s: Load, extents: dict[str, int], bounds: dict[str, InBounds]) -> dict[str, int]:
    """The loop extents a load reads over: a load masked by 0 <= i - c < n along one loop (a
    concatenation's part) reads n elements along it, not the loop's extent."""
    bound = bounds.get(s.mask) if s.mask else None
    if bound is None or len(bound.index.terms) != 1:
        return extents
    (atom, coef), = bound.index.terms
    if not isinstance(atom, Sym) or atom.name not in extents or coef not in (1, -1):
        return extents
    return {**extents, atom.name: min(extents[atom.name], hint(bound.size))}


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _gathers(kernel: Kernel) -> set[int]:
    """The loads (by id) whose address changes along the kernel's innermost loop through a
    value read from memory (an index gathered at every element): each is a gather. An
    embedding's row index, fixed along its row, is not (its row is read contiguously), nor
    is an address computed from the loop indices alone."""
    if not kernel.outer and not kernel.reduce:
        return set()
    along = (kernel.reduce[-1] if kernel.reduce and not column_reduction(kernel) else kernel.outer[-1]).name
    varies: set[str] = set()  # values that change along the innermost loop
    loaded: set[str] = set()  # values computed from a value read from memory
    found: set[int] = set()
    for stage in kernel.stages:
        for s in stage.body:
            out = getattr(s, "out", None)
            if isinstance(s, (Load, IndexValue)):
                names = {sym.name for sym in s.index.symbols()}
                if along in names or names & varies:
                    varies.add(out)
                if isinstance(s, Load) or names & loaded:
                    loaded.add(out)
                if isinstance(s, Load) and names & varies & loaded:
                    found.add(id(s))
            elif isinstance(s, Compute):
                if varies.intersection(s.args):
                    varies.add(out)
                if loaded.intersection(s.args):
                    loaded.add(out)
    return found


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
    FLOPs: one per element-wise op or reduction step per iteration of its stage; a gather
    (_gathers) adds the work of function_cost("gather"), besides its bytes."""
    if getattr(kernel, "product", ""):  # a matmul template (ir/matmul.py)
        return matmul_template_cost(kernel, ceilings)
    members = getattr(kernel, "members", ())
    if members:  # a group (ir/group.py): its members' work, one launch
        parts = [kernel_cost(m, ceilings, in_cache) for m in members]
        busy = sum(c.busy_s for c in parts)
        seconds = with_launch(ceilings.kernel_launch_s, busy, ceilings)
        bound = "launch" if is_launch_bound(ceilings.kernel_launch_s, busy, ceilings) else parts[0].bound
        return Cost(kernel.name, sum(c.must_move for c in parts), sum(c.moves for c in parts),
                    sum(c.flops for c in parts), 1, seconds, sum(c.floor_s for c in parts), bound,
                    busy)
    scratch = {s.name for s in kernel.scratch}
    extents = {s.name: hint(s.extent or 1) for s in (*kernel.outer, *kernel.reduce)}
    reduce_names = {s.name for s in kernel.reduce}
    first_read: dict[str, int] = {}  # buffer -> bytes of its first reading stage
    again: dict[str, int] = {}  # buffer -> bytes of the stages that read it again
    row_bytes: dict[str, int] = {}  # buffer -> bytes of one row (re-read buffers)
    written: dict[str, int] = {}
    flops = work = 0.0
    gathers = _gathers(kernel)
    for stage in kernel.stages:
        iterations = hint(kernel.outer_numel) * (hint(kernel.reduce_numel) if stage.loop else 1)
        stage_reads: dict[str, int] = {}
        bounds = {s.out: s for s in stage.body if isinstance(s, InBounds)}
        for s in stage.body:
            if isinstance(s, Load) and s.buf not in scratch:
                reach = _masked_extents(s, extents, bounds)
                size = _elements(s.index, reach, iterations) * _itemsize(s.dtype)
                stage_reads[s.buf] = max(stage_reads.get(s.buf, 0), size)
                if id(s) in gathers:
                    work += iterations * function_cost("gather", ceilings)
                row = {**{n: 1 for n in extents}, **{n: extents[n] for n in reduce_names}}
                row_bytes[s.buf] = _elements(s.index, row, hint(kernel.reduce_numel)) * _itemsize(s.dtype)
            elif isinstance(s, Store) and s.buf not in scratch:
                size = _elements(s.index, extents, iterations) * _itemsize(s.dtype)
                written[s.buf] = max(written.get(s.buf, 0), size)
            elif isinstance(s, Compute):
                flops += iterations
                work += iterations * function_cost(s.fn, ceilings)
            elif isinstance(s, Reduce):
                flops += iterations
                if s.kind == "expsum":  # an exp and a subtraction per element besides the sum
                    flops += 2 * iterations
                    step = function_cost("reduce.sum", ceilings) + 1 + function_cost("exp", ceilings)
                    work += iterations * step
                else:
                    work += iterations * function_cost(f"reduce.{s.kind}", ceilings)
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
    return predict(kernel.name, must_move, moves, flops, work, ceilings.kernel_launch_s, ceilings,
                    ceilings.ops_per_s, "compute", cached)


def touched_bytes(kernel: Kernel) -> dict[str, int]:
    """The bytes of each buffer parameter one launch of kernel reads or writes, each once
    (a gather's table: the rows it reads, not the whole table); {} for a group or a template."""
    if getattr(kernel, "product", "") or getattr(kernel, "members", ()):
        return {}
    scratch = {s.name for s in kernel.scratch}
    extents = {s.name: hint(s.extent or 1) for s in (*kernel.outer, *kernel.reduce)}
    touched: dict[str, int] = {}
    for stage in kernel.stages:
        iterations = hint(kernel.outer_numel) * (hint(kernel.reduce_numel) if stage.loop else 1)
        bounds = {s.out: s for s in stage.body if isinstance(s, InBounds)}
        for s in stage.body:
            if isinstance(s, (Load, Store)) and s.buf not in scratch:
                reach = _masked_extents(s, extents, bounds) if isinstance(s, Load) else extents
                size = _elements(s.index, reach, iterations) * _itemsize(s.dtype)
                touched[s.buf] = max(touched.get(s.buf, 0), size)
    return touched


# --- matmul templates (ir/matmul.py) ------------------------------------------------------

# The share of cuBLAS's rate the Triton template reaches on shapes that tile evenly (16-bit
# operands on Hopper), as timed on the H200 (docs/benchmarks.md): a template is chosen only
# where fusing saves more than that.
TEMPLATE_MATMUL_EFFICIENCY = 0.7
# The share of ATen's matmul rate (oneDNN) the C++ template (codegen/cpp_matmul.py) reaches in
# each of its loop forms, as timed on the CPU (docs/benchmarks.md): it pays only where ATen's
# call and the separate epilogue cost more than the product. A layout of no form runs a scalar
# loop (a twentieth: an estimate, not timed).
CPU_TEMPLATE_MATMUL_EFFICIENCY = {"dot": 0.45, "rows": 0.65, None: 0.05}


def template_efficiency(kernel, ceilings: Ceilings) -> float:
    """The share of the device's matmul rate a matmul template of its backend reaches."""
    if not ceilings.device.startswith("cpu"):
        return TEMPLATE_MATMUL_EFFICIENCY
    return CPU_TEMPLATE_MATMUL_EFFICIENCY[loop_form(kernel)]


def _without_product(kernel) -> Kernel:
    """A matmul kernel's epilogue as a plain point-wise kernel, less its loads of the product."""
    stages = tuple(dataclasses.replace(st, body=tuple(s for s in st.body if not (
        isinstance(s, Load) and s.buf == kernel.product))) for st in kernel.stages)
    return Kernel(kernel.name, kernel.outer, (), kernel.params, stages)


def matmul_template_cost(kernel, ceilings: Ceilings, wave_share: float = 1.0) -> Cost:
    """One launch of a matmul template: the product at the template's share of the matmul
    rate (template_efficiency), times the share of SMs its waves of tiles keep busy (from the
    backend, 1 where not given), reading each operand once and what the epilogue reads,
    writing its stores."""
    epilogue = kernel_cost(_without_product(kernel), ceilings)
    operands = (kernel.m + kernel.n) * kernel.k * kernel.operand_dtype.itemsize
    must_move = epilogue.must_move + operands
    flops = 2.0 * kernel.m * kernel.n * kernel.k
    rate = ceilings.matmul_flop_per_s * template_efficiency(kernel, ceilings) * wave_share
    # on a CPU, as its ATen call is (aten_cost): from the last-level cache where it fits
    cached = must_move if ceilings.device.startswith("cpu") and fits_cache(must_move, ceilings) else 0
    memory_s = memory_seconds(must_move, cached, ceilings)
    busy = max(memory_s, flops / rate, epilogue.busy_s)
    bound = "memory" if memory_s >= flops / rate else "matmul"
    floor_s = max(memory_s, flops / ceilings.matmul_flop_per_s)
    seconds = with_launch(ceilings.kernel_launch_s, busy, ceilings)
    return Cost(kernel.name, must_move, must_move, flops + epilogue.flops, 1, seconds, floor_s, bound, busy)




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
    """A shape family's sizes at their traced examples (sizes.hint)."""
    shape, stride = tuple(map(hint, shape)), tuple(map(hint, stride))
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
            nbytes = numel_hint(ins.shape) * ins.dtype.itemsize
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
            if out is not None and not launches_nothing(resolved_op(ins.op)):
                args = _on_meta(ins.args, buffers, program.constants)
                cost.aten.append(aten_cost(ins.op, list(args), out, ceilings))
    held = memory.held_at_launches(ceilings.cache_bytes) if ceilings.cache_copy_bytes_per_s else {}
    for n, (index, kernel, params, fresh_bytes) in enumerate(launches):
        in_cache = frozenset(p for p, a in params.items() if memory.memory(a) in held[n]) if held else None
        cost.kernels[index] = first_touch(kernel_cost(kernel, ceilings, in_cache), fresh_bytes, ceilings)
    return cost


def _nbytes(value: Any) -> int:
    return sum(tensor_bytes(t) for t in tensors_in(value))


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

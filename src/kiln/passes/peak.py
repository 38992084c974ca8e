"""Peak memory of a compiled call, read from its host programs (ir/host.py) without running them.

The walk follows each instruction's allocations and frees: a buffer's memory is released when
the last name referring to it (the buffer, its views, the items of a tuple) is freed or the
program returns. For a training step the forward is walked, then the backward: what the forward
returns stays live (its outputs with the caller, the tensors saved for the backward until the
backward frees them after their last read), and so does the thread's arena (it persists
across calls, as large as the largest program's temporaries). Memory the step did not allocate
(parameters, the batch) is left out: the peak is what the compiled step adds on top of it.

ATen results have no layout in the program: their sizes come from the compile's buffer layouts
(CompileReport.buffer_layouts); a buffer of unknown size counts 0 bytes and is marked so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir.host import (
    Alloc,
    CallAten,
    CopyMemory,
    EagerLayout,
    EnsureLayout,
    Free,
    HostProgram,
    Item,
    Launch,
    Ref,
    Restride,
    Return,
    View,
    arena_bytes,
    extent,
    instr_str,
    refs,
)

# what a buffer is for, at the peak
SAVED, TEMPORARY, OUTPUT, GRADIENT, ARENA, TANGENT = \
    "saved for the backward", "temporary", "output", "gradient", "arena", "incoming gradient"


@dataclass(frozen=True)
class LiveBuffer:
    name: str  # the buffer's name in its program ("buf3", "arg2" of the backward)
    program: str  # "forward", "backward" or "graph"
    role: str  # SAVED, TEMPORARY, ...
    nbytes: int
    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    made_by: str  # the kernel or ATen op that wrote it ("" for an arena)
    code: str = ""  # the model code it came from, when the source map knows it
    size_known: bool = True

    def text(self) -> str:
        layout = "" if self.shape is None else f"{str(self.dtype).replace('torch.', '')}{list(self.shape)} "
        size = _bytes(self.nbytes) if self.size_known else "size unknown"
        parts = [f"{self.name} {layout}{size}", f"by {self.made_by}" if self.made_by else ""]
        if self.code:
            parts.append(f"from {self.code}")
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class PeakMemory:
    """The most memory the call holds at once, where, and what is live then."""

    nbytes: int
    program: str  # where the peak is: "forward", "backward" or "graph"
    step: int  # index of the instruction in that program's body
    instruction: str
    live: tuple[LiveBuffer, ...]  # largest first
    peaks: dict[str, int] = field(default_factory=dict)  # each program's own peak

    def by_role(self) -> dict[str, list[LiveBuffer]]:
        out: dict[str, list[LiveBuffer]] = {}
        for b in self.live:
            out.setdefault(b.role, []).append(b)
        return out

    def text(self, show: int = 3) -> str:
        parts = []
        for role, bufs in sorted(self.by_role().items(), key=lambda kv: -sum(b.nbytes for b in kv[1])):
            largest = "; ".join(b.text() for b in bufs[:show])
            parts.append(f"  {role} {_bytes(sum(b.nbytes for b in bufs))} ({len(bufs)} tensor"
                         f"{'s' if len(bufs) != 1 else ''}, largest {largest})")
        each = ", ".join(f"{p} {_bytes(n)}" for p, n in self.peaks.items())
        return "\n".join([f"peak memory {_bytes(self.nbytes)} in the {self.program} at instruction "
                          f"{self.step} `{self.instruction}` ({each}); live then:", *parts])


def _count(n: Any) -> int | None:
    """A size as a number; None where it is symbolic (a program of a shape family)."""
    try:
        return int(n)
    except TypeError:
        return None


def _nbytes(shape, stride, dtype) -> int | None:
    n = _count(extent(shape, stride))
    return None if n is None else n * dtype.itemsize


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


Layouts = dict[str, tuple[torch.dtype, tuple[int, ...]]]


@dataclass
class _Walk:
    """The live memory of one step, program after program."""

    live: dict[int, LiveBuffer] = field(default_factory=dict)  # memory id -> what holds it
    holders: dict[int, set[str]] = field(default_factory=dict)  # memory id -> names referring to it
    mem_of: dict[str, int] = field(default_factory=dict)  # a name in the current program -> memory id
    next_id: int = 0
    current: int = 0
    # the peak so far: bytes, program, step, instruction, (memory id, buffer) live then
    best: tuple[int, str, int, str, tuple[tuple[int, LiveBuffer], ...]] = (-1, "", 0, "", ())

    def new(self, name: str, buf: LiveBuffer) -> None:
        self.next_id += 1
        self.live[self.next_id] = buf
        self.holders[self.next_id] = {name}
        self.mem_of[name] = self.next_id
        self.current += buf.nbytes

    def alias(self, name: str, src: str) -> None:
        mem = self.mem_of.get(src)
        if mem is not None:
            self.mem_of[name] = mem
            self.holders[mem].add(name)

    def drop(self, name: str) -> None:
        mem = self.mem_of.pop(name, None)
        if mem is None or mem not in self.holders:
            return
        self.holders[mem].discard(name)
        if not self.holders[mem]:
            del self.holders[mem]
            self.current -= self.live.pop(mem).nbytes

    def observe(self, program: str, step: int, ins: Any) -> None:
        if self.current > self.best[0]:
            self.best = (self.current, program, step, instr_str(ins), tuple(self.live.items()))

    def saved_at_peak(self, program: str, saved: set[int]) -> None:
        """A forward's peak inside it: the buffers it then returns to its backward are saved
        for it already there (as they are at the return: written, by what)."""
        nbytes, where, step, text, live = self.best
        if where == program:
            self.best = (nbytes, where, step, text, tuple(
                (m, _replace(self.live.get(m, b), role=SAVED) if m in saved else b) for m, b in live))


def _origin(report: Any, key: str) -> str:
    entry = getattr(report, "source_map", {}).get(key) if report is not None else None
    if entry is None or not entry.sites:
        return ""
    return entry.sites[0].text()


def _walk_program(walk: _Walk, program: HostProgram, label: str, report: Any, layouts: Layouts,
                  arg_memory: dict[int, int], returned_role: str) -> tuple[list[int | None], int]:
    """Walks one program; arg_memory: argument index -> memory id it refers to (else the
    argument is memory the step did not allocate). Returns the memory ids of the returned
    values (None for a literal or untracked value) and the program's own peak."""
    walk.mem_of = {}
    for k, mem in arg_memory.items():
        walk.mem_of[f"arg{k}"] = mem
        walk.holders[mem].add(f"arg{k}")
    made_by: dict[str, str] = {}
    tuples: set[str] = {i.src for i in program.body if isinstance(i, Item)}
    peak = walk.current

    def add(name: str, dtype, shape, nbytes: int | None, by: str, code: str) -> None:
        walk.new(name, LiveBuffer(name, label, TEMPORARY, nbytes or 0, shape, dtype, by, code,
                                  nbytes is not None))

    def layout_bytes(name: str) -> tuple[Any, Any, int | None]:
        if name not in layouts:
            return None, None, None
        dtype, shape = layouts[name]
        numel = 1
        for size in shape:
            numel *= size
        n = _count(numel)
        return dtype, tuple(shape), None if n is None else n * dtype.itemsize

    for k, ins in enumerate(program.body):
        if isinstance(ins, Alloc) and ins.slot is None:
            add(ins.out, ins.dtype, tuple(ins.shape), _nbytes(ins.shape, ins.stride, ins.dtype), "", "")
        elif isinstance(ins, Alloc):
            walk.mem_of.pop(ins.out, None)  # a view of the arena, counted with it
        elif isinstance(ins, View):
            walk.alias(ins.out, ins.base)
        elif isinstance(ins, Launch):
            for w in ins.writes:
                made_by.setdefault(w, ins.kernel)
                mem = walk.mem_of.get(w)
                buf = walk.live.get(mem) if mem is not None else None
                if buf is not None and not buf.made_by:
                    walk.live[mem] = _replace(buf, made_by=ins.kernel, code=_origin(report, ins.kernel))
        elif isinstance(ins, CallAten):
            op = ins.op if isinstance(ins.op, str) else ins.op.name
            if ins.out in tuples or (ins.may_alias and refs(ins.args)):
                src = refs(ins.args)
                if ins.out not in tuples and src:
                    walk.alias(ins.out, src[0])  # a result that may be a view: no new memory
                made_by[ins.out] = op
            else:
                dtype, shape, nbytes = layout_bytes(ins.out)
                add(ins.out, dtype, shape, nbytes, op, _origin(report, ins.out))
        elif isinstance(ins, Item):
            dtype, shape, nbytes = layout_bytes(ins.out)
            by = made_by.get(ins.src, "")
            add(ins.out, dtype, shape, nbytes, by, _origin(report, ins.src))
        elif isinstance(ins, (EnsureLayout, EagerLayout)):
            if ins.out != ins.src:
                walk.alias(ins.out, ins.src)
        elif isinstance(ins, (Restride, CopyMemory)):
            src = walk.live.get(walk.mem_of.get(ins.src, -1))
            if src is not None:
                add(ins.out, src.dtype, src.shape, src.nbytes, "copy", src.code)
        elif isinstance(ins, Free):
            walk.drop(ins.name)
        elif isinstance(ins, Return):
            result = [walk.mem_of.get(v.name) if isinstance(v, Ref) else None for v in ins.values]
            for mem in result:
                if mem is not None and mem in walk.live:
                    walk.live[mem] = _replace(walk.live[mem], role=returned_role)
            for mem in set(m for m in result if m is not None):
                walk.holders[mem].add(f"<returned {mem}>")
            for name in list(walk.mem_of):  # the program's own names go when it returns
                walk.drop(name)
            return result, peak
        walk.observe(label, k, ins)
        peak = max(peak, walk.current)
    return [], peak


def _replace(buf: LiveBuffer, **changes: Any) -> LiveBuffer:
    import dataclasses

    return dataclasses.replace(buf, **changes)


def _arena(walk: _Walk, programs: list[tuple[HostProgram | None, str]]) -> None:
    """The thread's arena (runtime/host_ops.py): as large as the largest program's slots, which
    every program shares, kept across calls."""
    sizes = [(arena_bytes(p.arena), label, len(p.arena)) for p, label in programs
             if p is not None and p.arena]
    if sizes:
        nbytes, label, slots = max(sizes)
        shared = f", shared by {len(sizes)} programs" if len(sizes) > 1 else ""
        why = f"{slots} slots of temporaries of the {label}{shared}, kept across calls"
        walk.new("arena", LiveBuffer("arena", label, ARENA, nbytes, None, None, "", why))


def _finish(walk: _Walk, peaks: dict[str, int]) -> PeakMemory:
    nbytes, program, step, text, live = walk.best
    live = tuple(sorted((b for _, b in live), key=lambda b: -b.nbytes))
    return PeakMemory(max(nbytes, 0), program, step, text, live, peaks)


def graph_peak(program: HostProgram, report: Any = None) -> PeakMemory:
    """The peak of one program called alone (an inference graph)."""
    walk = _Walk()
    _arena(walk, [(program, "graph")])
    layouts = getattr(report, "buffer_layouts", None) or {}
    _, peak = _walk_program(walk, program, "graph", report, layouts, {}, OUTPUT)
    return _finish(walk, {"graph": peak})


def _saved_layouts(report: Any) -> list[str]:
    return [t for _, t in report.partition.saved]


def _is_backward_of(forward: Any, report: Any) -> bool:
    """Whether report's program takes forward's saved tensors as its first arguments."""
    program = report.host_program
    saved = _saved_layouts(forward)
    if report.partition is not None or program is None or program.num_args < len(saved):
        return False
    specs = {s.position: f"{str(s.dtype).replace('torch.', '')}{list(s.shape)}" for s in program.inputs}
    return all(specs.get(k, t) == t for k, t in enumerate(saved))


def _walk_backward(walk: _Walk, program: HostProgram, label: str, report: Any,
                   saved: list[int | None]) -> int:
    args = {k: mem for k, mem in enumerate(saved) if mem is not None and mem in walk.live}
    for mem in set(args.values()):  # the backward's arguments become their only holders
        walk.holders[mem] = {h for h in walk.holders[mem] if not h.startswith("<returned")}
    passed_on = [m for m, b in walk.live.items() if b.role == GRADIENT and b.program != label]
    for spec in program.inputs:  # incoming gradients: a later graph's backward returned them, or new memory
        if spec.position >= len(saved):
            nbytes = _nbytes(spec.shape, spec.stride, spec.dtype) or 0
            same = next((m for m in passed_on if walk.live[m].nbytes == nbytes
                         and walk.live[m].dtype == spec.dtype), None)
            if same is not None:
                passed_on.remove(same)
                walk.holders[same] = set()  # autograd hands it over: the backward's argument holds it
                args[spec.position] = same
                continue
            walk.next_id += 1
            walk.live[walk.next_id] = LiveBuffer(spec.name, label, TANGENT, nbytes, tuple(spec.shape),
                                                 spec.dtype, "autograd")
            walk.holders[walk.next_id] = set()
            walk.current += nbytes
            args[spec.position] = walk.next_id
    layouts = getattr(report, "buffer_layouts", None) or {}
    _, peak = _walk_program(walk, program, label, report, layouts, args, GRADIENT)
    return peak


def step_peak(reports: list[Any]) -> PeakMemory | None:
    """The peak of one call that ran these compiled graphs in this order (a training step:
    forwards, then their backwards in reverse order). Each backward is paired with the latest
    unpaired forward whose saved tensors it takes; what a forward returns to the caller stays
    live to the end of the step, an upper bound where the caller drops it sooner."""
    reports = [r for r in reports if r.host_program is not None]
    if not reports:
        return None
    walk = _Walk()
    labels, forwards = [], []
    for r in reports:
        if r.partition is not None:
            forwards.append(r)
        is_backward = r.partition is None and bool(forwards) and _is_backward_of(forwards[-1], r)
        if is_backward:
            forwards.pop()
        labels.append("forward" if r.partition is not None else "backward" if is_backward else "graph")
    pending: list[tuple[Any, list[int | None]]] = []
    single = len(reports) <= 2
    names = [lab if single else f"graph {i} ({lab})" for i, lab in enumerate(labels)]
    _arena(walk, [(r.host_program, name) for r, name in zip(reports, names)])
    peaks: dict[str, int] = {}
    for r, name in zip(reports, names):
        layouts = getattr(r, "buffer_layouts", None) or {}
        if r.partition is not None:
            returned, peaks[name] = _walk_program(walk, r.host_program, name, r, layouts, {}, OUTPUT)
            num_saved = len(r.partition.saved)
            saved = returned[len(returned) - num_saved:] if num_saved else []
            for mem in saved:
                if mem is not None and mem in walk.live:
                    walk.live[mem] = _replace(walk.live[mem], role=SAVED)
            walk.saved_at_peak(name, {m for m in saved if m is not None})
            pending.append((r, saved))
        elif pending and _is_backward_of(pending[-1][0], r):
            _, saved = pending.pop()
            peaks[name] = _walk_backward(walk, r.host_program, name, r, saved)
        else:
            _, peaks[name] = _walk_program(walk, r.host_program, name, r, layouts, {}, OUTPUT)
    return _finish(walk, peaks)

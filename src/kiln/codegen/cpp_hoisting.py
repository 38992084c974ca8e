"""Where a C++ kernel's statements are computed: once before all loops, once per line or row,
or at every element. Statements whose values do not change along a loop leave it, so that
the loop keeps only the work that varies and vectorizes."""

from __future__ import annotations

from kiln.ir import kernel as k


def computing(body: tuple[k.Stmt, ...], value: str) -> list[k.Stmt]:
    """The statements of body that value is computed from (loads, constants, arithmetic),
    in their order: what a pass over a block needs to recompute it."""
    pure = (k.Load, k.Const, k.IndexValue, k.InBounds, k.Compute)
    producers = {s.out: s for s in body if isinstance(s, pure)}
    needed, stack = set(), [value]
    while stack:
        name = stack.pop()
        s = producers.get(name)
        if s is None or name in needed:
            continue
        needed.add(name)
        if isinstance(s, k.Compute):
            stack.extend(s.args)
        if isinstance(s, k.Load) and s.mask:
            stack.append(s.mask)
        index = getattr(s, "index", None)
        if index is not None:
            stack.extend(sym.name for sym in index.symbols())
    return [s for s in body if getattr(s, "out", None) in needed and not isinstance(s, k.Reduce)]


def loop_invariant(kernel: k.Kernel) -> set[int]:
    """The statements (by id) of a point-wise kernel that compute the same value at every
    point: loads at a constant index, constants, and what is computed from those alone."""
    written = {p.name for p in kernel.params if p.is_output}
    invariant: set[str] = set()
    found: set[int] = set()
    for stage in kernel.stages:
        for s in stage.body:
            constant_load = (isinstance(s, k.Load) and s.mask is None and s.buf not in written
                             and not s.index.symbols())
            computed = isinstance(s, k.Compute) and all(a in invariant for a in s.args)
            if constant_load or computed or isinstance(s, k.Const):
                invariant.add(s.out)
                found.add(id(s))
    return found


def line_invariant(kernel: k.Kernel, along: set) -> set[int]:
    """The statements (by id) whose values do not change along the loops over `along` (a
    point-wise kernel's vector loop, or a reduction's row): a gather's row index and its
    bounds check, a row's scale. Computed once per line, they leave the loop contiguous
    loads it vectorizes; inside it, a loaded index and its check (a max reduction) keep it
    scalar. A reduction's result is never among them: it is known only after its loop."""
    written = {p.name for p in kernel.params if p.is_output} | {b.name for b in kernel.scratch}
    invariant: set[str] = set()
    found: set[int] = set()

    loops = {sym.name for sym in kernel.outer}

    def fixed(index) -> bool:  # an index's symbols are loops' or values' (a gather's)
        return all(sym not in along and (sym.name in loops or sym.name in invariant)
                   for sym in index.symbols())

    for stage in kernel.stages:
        for s in stage.body:
            if isinstance(s, k.Load):
                same = s.buf not in written and fixed(s.index) and (s.mask is None or s.mask in invariant)
            elif isinstance(s, (k.IndexValue, k.InBounds)):
                same = fixed(s.index)
            elif isinstance(s, k.Compute):
                same = all(a in invariant for a in s.args)
            elif isinstance(s, k.Flag):
                same = s.cond in invariant and s.value in invariant
            else:
                same = isinstance(s, k.Const)
            if same:
                invariant.add(getattr(s, "out", None))
                found.add(id(s))
    return found


def values_of(kernel: k.Kernel, ids: set[int]) -> set[str]:
    return {s.out for stage in kernel.stages for s in stage.body if id(s) in ids and getattr(s, "out", None)}


def row_invariant(kernel: k.Kernel, known: set[str]) -> dict[int, list[k.Stmt]]:
    """Per loop stage (by id) of a reduction kernel: the arithmetic that does not change along
    the row but needs an earlier stage's reduction (a norm's mean, its 1 / sqrt(var + eps)).
    Computed once per row between the loops, it leaves the loop its element-wise work alone;
    inside it, a square root and a division at every element. known: values computed before
    the row's loops (line_invariant's)."""
    invariant, reduced = set(known), set()
    per_stage: dict[int, list[k.Stmt]] = {}
    for stage in kernel.stages:
        if stage.loop:
            for s in stage.body:
                if (isinstance(s, k.Compute) and s.out not in invariant
                        and all(a in invariant or a in reduced for a in s.args)):
                    invariant.add(s.out)
                    per_stage.setdefault(id(stage), []).append(s)
        reduced |= {s.out for s in stage.body if isinstance(s, k.Reduce)}
    return per_stage

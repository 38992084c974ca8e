"""Reductions in C++ kernels: accumulators, their updates and the loops that run them.

A row reduction's stage is a loop over the reduction domain whose innermost dimension is a SIMD
loop with the accumulators as OpenMP reductions. A floating-point sum adds blocks of SUM_BLOCK
terms into fresh partials; an online exponential sum (expsum) rescales once per block. A
reduction down the columns of a row-major operand walks COLUMN_BLOCK neighbouring outputs at a
time, each row element a SIMD loop over the block.

`Reductions` is a part of cpp.py's renderer: it uses the renderer's emit, stmt, types,
hoisted, per_row and block_partial.
"""

from __future__ import annotations

from functools import partial

import torch

from kiln.codegen.cpp_hoisting import computing
from kiln.codegen.cpp_lines import PARALLEL_MIN_WORK, at_least
from kiln.codegen.cpp_values import STORAGE_TYPE, ctype, render_index, size_params
from kiln.ir import kernel as k
from kiln.ir.index import Sym
from kiln.ir.kernel import compute_dtype
from kiln.ir.ops import LIBRARY_MATH
from kiln.ir.sizes import is_symbolic
from kiln.ir.sizes import render as sc

COLUMN_BLOCK = 64  # neighbouring outputs a column reduction computes together

# A floating-point sum adds this many terms (per SIMD lane: a sixteenth) into a fresh partial
# sum, then the partial into its total: a running sum's rounding error grows with its length.
SUM_BLOCK = 1024

_REDUCE_INIT = {"sum": "0", "prod": "1", "expsum": "0"}


def _reduce_init(kind: str, t: torch.dtype) -> str:
    if kind in _REDUCE_INIT:
        return f"({ctype(t)}){_REDUCE_INIT[kind]}"
    low = kind in ("max", "argmax")
    if t.is_floating_point:
        return f"{'-' if low else ''}std::numeric_limits<{ctype(t)}>::infinity()"
    if t is torch.bool:
        return "false" if low else "true"
    return f"std::numeric_limits<{ctype(t)}>::{'lowest' if low else 'max'}()"


# expsum's accumulator in the SIMD loop is its block partial: a plain sum (see _expsum_block)
_OMP_REDUCTION = {"sum": "+", "prod": "*", "max": "max", "min": "min", "expsum": "+"}


def _blocked_sums(reductions: list[k.Reduce]) -> list[k.Reduce]:
    """The floating-point sums, which accumulate each block of SUM_BLOCK terms apart."""
    return [r for r in reductions if r.kind == "sum" and compute_dtype(r.dtype).is_floating_point]


def _simd_pragma(reductions: list[k.Reduce], renamed: dict[str, str]) -> str:
    """SIMD over the innermost reduction loop, accumulators (renamed: their block partials)
    as OpenMP reductions. argmax/argmin keep a sequential first-index rule, so their loops
    stay scalar."""
    if any(r.kind in ("argmax", "argmin") for r in reductions):
        return "// sequential: first index wins"
    pragma = "#pragma omp simd"
    for r in reductions:
        op = _logical_op(r) or _OMP_REDUCTION[r.kind]
        pragma += f" reduction({op}:{renamed.get(r.out, r.out)})"
        if r.kind in ("max", "min") and compute_dtype(r.dtype).is_floating_point:
            pragma += f" reduction(|:{r.out}_nan)"
    return pragma


class Reductions:
    """The reduction stages of a kernel, rendered as loops (see the module's text)."""

    def reduce_update(self, s: k.Reduce, depth: int) -> None:
        v, acc = s.value, self.block_partial.get(s.out, s.out)
        if s.kind == "expsum":
            self.expsum_update(s, depth)
        elif s.kind == "sum":
            self.emit(depth, f"{acc} += {v};")
        elif s.kind == "prod":
            self.emit(depth, f"{acc} *= {v};")
        elif _logical_op(s):
            self.emit(depth, f"{acc} {_logical_op(s)}= ({v} != 0);")
        elif s.kind in ("max", "min"):
            t = compute_dtype(s.dtype)
            cmp = ">" if s.kind == "max" else "<"
            # a plain compare-select vectorizes as an OpenMP max/min reduction; NaN is
            # tracked on the side and restores eager's NaN propagation after the loop
            self.emit(depth, f"{acc} = {v} {cmp} {acc} ? {v} : {acc};")
            if t.is_floating_point:
                self.emit(depth, f"{acc}_nan |= ({v} != {v});")
        else:  # argmax / argmin: the first position of the extreme value (NaN counts as extreme)
            cmp = ">" if s.kind == "argmax" else "<"
            best = f"{acc}_v"
            nan = f"{v} != {v}" if compute_dtype(s.dtype).is_floating_point else "false"
            self.emit(depth, f"if (!({best} != {best}) && (({nan}) || {v} {cmp} {best})) "
                             f"{{ {best} = {v}; {acc} = {render_index(s.index)}; }}")

    def expsum_update(self, s: k.Reduce, depth: int) -> None:
        """In a row loop, the block's terms against the shift _expsum_block chose; in a
        column block (no row blocks), the online step per element."""
        t = compute_dtype(s.dtype)
        exp = "expf" if t is torch.float32 else "exp"
        if s.out in self.block_partial:
            self.emit(depth, f"{self.block_partial[s.out]} += {exp}({s.value} - {s.out}_shift);")
            return
        m, ct = f"{s.out}_max", ctype(t)
        self.emit(depth, f"const {ct} {s.out}_next = {s.value} > {m} ? {s.value} : {m};")
        self.emit(depth, f"const {ct} {s.out}_shift = {_finite_shift(s.out + '_next', t)};")
        shift = f"{s.out}_shift"
        self.emit(depth, f"{s.out} = {s.out} * {exp}({m} - {shift}) + {exp}({s.value} - {shift});")
        self.emit(depth, f"{m} = {s.out}_next;")

    def reduce_init(self, s: k.Reduce, depth: int) -> None:
        t = compute_dtype(s.dtype)
        if s.kind == "expsum":
            self.emit(depth, f"{ctype(t)} {s.out} = 0;")
            self.emit(depth, f"{ctype(t)} {s.out}_max = {_reduce_init('max', t)};")
            self.types[s.out] = t
        elif s.kind in ("argmax", "argmin"):
            self.emit(depth, f"{ctype(t)} {s.out}_v = {_reduce_init(s.kind, t)};")
            self.emit(depth, f"int64_t {s.out} = 0;")
            self.types[s.out] = torch.int64
        elif _logical_op(s):
            self.emit(depth, f"int32_t {s.out} = {_logical_init(s)};")
            self.types[s.out] = torch.bool
        else:
            self.emit(depth, f"{ctype(t)} {s.out} = {_reduce_init(s.kind, t)};")
            self.types[s.out] = t
            if s.kind in ("max", "min") and t.is_floating_point:
                self.emit(depth, f"{_nan_flag_type(t)} {s.out}_nan = 0;")

    def reduce_finish(self, s: k.Reduce, depth: int) -> None:
        t = compute_dtype(s.dtype)
        if s.kind == "expsum":  # a row of -inf: each exp(x - max x) is exp(NaN), as in eager
            self.emit(depth, f"if ({s.out}_max == {_reduce_init('max', t)}) "
                             f"{s.out} = std::numeric_limits<{ctype(t)}>::quiet_NaN();")
        if s.kind in ("max", "min") and t.is_floating_point:
            self.emit(depth, f"if ({s.out}_nan) {s.out} = std::numeric_limits<{ctype(t)}>::quiet_NaN();")

    def loop_stage(self, stage: k.Stage, depth: int) -> None:
        """A loop stage over a row. An argmax or argmin over a row of one loop takes two passes:
        the extreme value (and whether a NaN is there) in the vectorized pass with the stage's
        other reductions, then the first position holding it, scalar, stopping there; a
        sequential first-index rule keeps the whole loop scalar."""
        args = [s for s in stage.body if isinstance(s, k.Reduce) and s.kind in ("argmax", "argmin")]
        if not args or len(self.k.reduce) != 1 or not all(map(partial(_found_again, stage), args)):
            self._loop_stage(stage, depth)
            return
        extremes = {id(a): k.Reduce(f"{a.out}_m", a.kind[3:], a.value, a.dtype) for a in args}
        first_pass = k.Stage(stage.loop, tuple(extremes.get(id(s), s) for s in stage.body))
        self.per_row[id(first_pass)] = self.per_row.get(id(stage), [])
        self._loop_stage(first_pass, depth)
        for a in args:
            self._first_position(a, stage, depth)

    def _first_position(self, a: k.Reduce, stage: k.Stage, depth: int) -> None:
        """The first position of the row whose value is a's extreme (a NaN, where there is one)."""
        m, v, sym = f"{a.out}_m", a.value, self.k.reduce[0]
        found = f"({m} != {m} ? {v} != {v} : {v} == {m})" if compute_dtype(a.dtype).is_floating_point \
            else f"{v} == {m}"
        self.emit(depth, f"int64_t {a.out} = 0;")
        self.types[a.out] = torch.int64
        self.emit(depth, f"for (int64_t {sym.name} = 0; {sym.name} < {sc(sym.extent)}; ++{sym.name}) {{")
        for s in computing(stage.body, v):
            if id(s) not in self.hoisted:
                self.stmt(s, depth + 1)
        self.emit(depth + 1, f"if ({found}) {{ {a.out} = {render_index(a.index)}; break; }}")
        self.emit(depth, "}")

    def _loop_stage(self, stage: k.Stage, depth: int) -> None:
        reductions = [s for s in stage.body if isinstance(s, k.Reduce)]
        for s in self.per_row.get(id(stage), ()):
            self.stmt(s, depth)
        for r in reductions:
            self.reduce_init(r, depth)
        syms = self.k.reduce
        sums = _blocked_sums(reductions) if at_least(self.k.reduce_numel, SUM_BLOCK + 1) else []
        expsums = [r for r in reductions if r.kind == "expsum"]
        if expsums:  # rescaled once per block: blocks however short the row
            sums = _blocked_sums(reductions) + expsums
        self.block_partial = {r.out: f"{r.out}_block" for r in sums}
        for i, sym in enumerate(syms[:-1]):
            self.emit(depth + i, f"for (int64_t {sym.name} = 0; {sym.name} < {sc(sym.extent)}; "
                                 f"++{sym.name}) {{")
        inner = depth + len(syms) - 1
        last = syms[-1]
        start, stop = "0", sc(last.extent)
        if sums:  # the innermost loop in blocks, each summed into fresh partials
            start, stop = self._sum_blocks(last, inner)
            inner += 1
            for r in sums:
                self.emit(inner, f"{ctype(compute_dtype(r.dtype))} {r.out}_block = 0;")
        for r in expsums:
            self._expsum_block(r, stage, last.name, start, stop, inner)
        self.emit(inner, _simd_pragma(reductions, self.block_partial), self.checks_inside())
        self.emit(inner, f"for (int64_t {last.name} = {start}; {last.name} < {stop}; ++{last.name}) {{")
        for s in stage.body:
            if id(s) not in self.hoisted:
                self.stmt(s, inner + 1)
        self.emit(inner, "}")
        if sums:
            for r in sums:
                self.emit(inner, f"{r.out} += {r.out}_block;")
            inner -= 1
            self.emit(inner, "}")
        self.block_partial = {}
        for i in reversed(range(len(syms) - 1)):
            self.emit(depth + i, "}")
        for r in reductions:
            self.reduce_finish(r, depth)

    def _sum_blocks(self, last: Sym, depth: int) -> tuple[str, str]:
        """Opens the loop over last's blocks of SUM_BLOCK terms; the bounds of a block's own loop."""
        block = f"{last.name}_block"
        self.emit(depth, f"for (int64_t {block} = 0; {block} < {sc(last.extent)}; {block} += {SUM_BLOCK}) {{")
        return block, f"std::min<int64_t>({block} + {SUM_BLOCK}, {sc(last.extent)})"

    def _expsum_block(self, r: k.Reduce, stage: k.Stage, i: str, start: str, stop: str, depth: int) -> None:
        """Before a block's terms are summed: the block's maximum (a SIMD pass over the
        block's values, which are in L1 cache), the running maximum raised to it and the
        sum so far rescaled to it: m' = max(m, max block); s *= exp(m - m'). The block's
        terms are then exp(x - m'), one exp each. A shift of -inf (no finite value yet)
        is taken as 0, so that exp(-inf - -inf) never enters the sum."""
        t = compute_dtype(r.dtype)
        ct, exp = ctype(t), ("expf" if t is torch.float32 else "exp")
        bmax = f"{r.out}_bmax"
        self.emit(depth, f"{ct} {bmax} = {_reduce_init('max', t)};")
        self.emit(depth, f"#pragma omp simd reduction(max:{bmax})")
        self.emit(depth, f"for (int64_t {i} = {start}; {i} < {stop}; ++{i}) {{")
        for s in computing(stage.body, r.value):
            if id(s) not in self.hoisted:
                self.stmt(s, depth + 1)
        self.emit(depth + 1, f"{bmax} = {r.value} > {bmax} ? {r.value} : {bmax};")
        self.emit(depth, "}")
        self.emit(depth, f"const {ct} {r.out}_next = {bmax} > {r.out}_max ? {bmax} : {r.out}_max;")
        self.emit(depth, f"const {ct} {r.out}_shift = {_finite_shift(r.out + '_next', t)};")
        self.emit(depth, f"{r.out} *= {exp}({r.out}_max - {r.out}_shift);")
        self.emit(depth, f"{r.out}_max = {r.out}_next;")

    # -------------------------------------------------------------- column reductions
    def _column_values(self, names: list[tuple[str, str]], depth: int, by_reference: bool,
                       array: dict[str, str] | None = None) -> None:
        """Bind the per-column accumulators of the current block point (xi) to their names
        (array: those held in another array than name_col)."""
        for name, t in names:
            source = (array or {}).get(name, f"{name}_col")
            self.emit(depth, f"{t}{'&' if by_reference else ''} {name} = {source}[xi];")

    def _column_accumulators(self, s: k.Reduce) -> list[tuple[str, str]]:
        t = ctype(compute_dtype(s.dtype))
        if s.kind in ("argmax", "argmin"):
            return [(f"{s.out}_v", t), (s.out, "int64_t")]
        if _logical_op(s):
            return [(s.out, "int32_t")]
        if s.kind in ("max", "min") and compute_dtype(s.dtype).is_floating_point:
            return [(s.out, t), (f"{s.out}_nan", _nan_flag_type(compute_dtype(s.dtype)))]
        if s.kind == "expsum":
            return [(s.out, t), (f"{s.out}_max", t)]
        return [(s.out, t)]

    def render_column(self) -> str:
        """A block of COLUMN_BLOCK neighbouring outer points at a time: each row element is a
        contiguous SIMD loop over the block, accumulating into per-column arrays."""
        kern, xb = self.k, COLUMN_BLOCK
        x = kern.outer[-1]
        params = ", ".join(
            f"{'' if p.is_output else 'const '}{STORAGE_TYPE[p.dtype]}* __restrict__ {p.name}"
            for p in kern.params) + size_params(kern)
        self.emit(0, f'extern "C" void {kern.name}({params}) {{')
        self.error_locals()
        outer = list(kern.outer[:-1])
        blocks = 2 if is_symbolic(kern.outer_numel) else \
            (x.extent + xb - 1) // xb * kern.outer_numel // x.extent
        if at_least(kern.outer_numel * kern.reduce_numel, PARALLEL_MIN_WORK) and blocks > 1:
            self.emit(1, f"#pragma omp parallel for collapse({len(outer) + 1})")
        depth = 1
        for sym in outer:
            self.emit(depth, f"for (int64_t {sym.name} = 0; {sym.name} < {sc(sym.extent)}; "
                             f"++{sym.name}) {{")
            depth += 1
        self.emit(depth, f"for (int64_t xb = 0; xb < {sc(x.extent)}; xb += {xb}) {{")
        depth += 1
        if not is_symbolic(x.extent) and x.extent % xb == 0:  # a constant trip count: loops unrolled
            self.emit(depth, f"constexpr int64_t xn = {xb};")
        else:
            self.emit(depth, f"const int64_t xn = std::min<int64_t>({xb}, {sc(x.extent)} - xb);")
        finished: list[tuple[str, str]] = []
        block_loop = "for (int64_t xi = 0; xi < xn; ++xi) {"
        for stage in kern.stages:
            reductions = [s for s in stage.body if isinstance(s, k.Reduce)]
            accumulators = [a for r in reductions for a in self._column_accumulators(r)]
            for r in reductions:
                t = compute_dtype(r.dtype)
                self.types[r.out] = torch.int64 if r.kind in ("argmax", "argmin") else t
                inits = {f"{r.out}_v": _reduce_init(r.kind, t), f"{r.out}_nan": "0",
                         f"{r.out}_max": _reduce_init("max", t)}
                for name, ctyp in self._column_accumulators(r):
                    if r.kind in ("argmax", "argmin"):
                        default = "0"
                    else:
                        default = _logical_init(r) if _logical_op(r) else _reduce_init(r.kind, t)
                    init = inits.get(name, default)
                    self.emit(depth, f"{ctyp} {name}_col[{xb}];")
                    self.emit(depth, f"for (int64_t xi = 0; xi < xn; ++xi) {name}_col[xi] = {init};")
            inner = depth
            long_rows = stage.loop and at_least(kern.reduce_numel, SUM_BLOCK + 1)
            sums = _blocked_sums(reductions) if long_rows else []
            partials = {r.out: f"{r.out}_block" for r in sums}
            if stage.loop:
                for sym in kern.reduce[:-1]:
                    i = sym.name
                    self.emit(inner, f"for (int64_t {i} = 0; {i} < {sc(sym.extent)}; ++{i}) {{")
                    inner += 1
                last = kern.reduce[-1]
                start, stop = "0", sc(last.extent)
                if sums:  # rows in blocks, each summed into fresh partials
                    start, stop = self._sum_blocks(last, inner)
                    inner += 1
                    for r in sums:
                        self.emit(inner, f"{ctype(compute_dtype(r.dtype))} {r.out}_block[{xb}];")
                        self.emit(inner, f"for (int64_t xi = 0; xi < xn; ++xi) {r.out}_block[xi] = 0;")
                self.emit(inner, f"for (int64_t {last.name} = {start}; {last.name} < {stop}; "
                                 f"++{last.name}) {{")
                inner += 1
            self.emit(inner, "#pragma omp simd")
            self.emit(inner, block_loop)
            self.emit(inner + 1, f"const int64_t {x.name} = xb + xi;")
            self._column_values(finished, inner + 1, by_reference=False)
            self._column_values(accumulators, inner + 1, by_reference=True, array=partials)
            for s in stage.body:
                self.stmt(s, inner + 1)
            self.emit(inner, "}")
            if stage.loop:
                inner -= 1
                self.emit(inner, "}")
                if sums:
                    for r in sums:
                        self.emit(inner, f"for (int64_t xi = 0; xi < xn; ++xi) "
                                         f"{r.out}_col[xi] += {r.out}_block[xi];")
                    inner -= 1
                    self.emit(inner, "}")
                for _ in kern.reduce[:-1]:
                    inner -= 1
                    self.emit(inner, "}")
            if any(r.kind in ("max", "min", "expsum") for r in reductions):
                self.emit(depth, block_loop)
                self._column_values(accumulators, depth + 1, by_reference=True)
                for r in reductions:
                    self.reduce_finish(r, depth + 1)
                self.emit(depth, "}")
            finished += [
                (r.out, "int64_t" if r.kind in ("argmax", "argmin") else ctype(compute_dtype(r.dtype)))
                for r in reductions
            ]
        for _ in range(len(outer) + 1):
            depth -= 1
            self.emit(depth, "}")
        self.report_errors()
        self.emit(0, "}")
        return "\n".join(self.lines)


def _found_again(stage: k.Stage, a: k.Reduce) -> bool:
    """Whether a scalar loop recomputing an arg reduction's values gets the very values the
    vectorized pass compared: not where a math-library call computes them (its vector and
    scalar versions may differ by an ulp, and no position would hold the extreme), nor for
    bool values."""
    if compute_dtype(a.dtype) is torch.bool:
        return False
    return not any(isinstance(s, k.Compute) and s.fn in LIBRARY_MATH for s in computing(stage.body, a.value))


def _logical_op(s: k.Reduce) -> str | None:
    """"|" or "&" for a reduction that ORs or ANDs truth values (any, all, a bool max or min),
    else None. Their accumulators are int32, OR- or AND-reduced: a bool accumulator with
    || or && keeps the loop scalar."""
    if s.kind == "any" or (s.kind == "max" and compute_dtype(s.dtype) is torch.bool):
        return "|"
    if s.kind == "all" or (s.kind == "min" and compute_dtype(s.dtype) is torch.bool):
        return "&"
    return None


def _logical_init(s: k.Reduce) -> str:
    return "1" if _logical_op(s) == "&" else "0"


def _nan_flag_type(t: torch.dtype) -> str:
    """A max or min reduction's NaN flag: an integer as wide as the values, so that its OR
    reduction vectorizes in the values' lanes (a bool flag keeps the loop scalar)."""
    return "int64_t" if t.itemsize == 8 else "int32_t"


def _finite_shift(m: str, t: torch.dtype) -> str:
    """The running maximum m as the online sum's shift: 0 while m is -inf."""
    return f"({m} == {_reduce_init('max', t)} ? ({ctype(t)})0 : {m})"

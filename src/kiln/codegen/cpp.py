"""C++ (OpenMP) renderer for kernel IR.

The outer domain becomes nested loops: parallel over the leading outer dimensions, a SIMD
loop innermost. A reduction kernel's stages are loops over the reduction domain
(cpp_reductions.py); each value is rendered from the op table of cpp_values.py.
"""

from __future__ import annotations

import torch

from kiln.codegen import cpp_lines
from kiln.codegen.cpp_hoisting import line_invariant, loop_invariant, row_invariant, values_of
from kiln.codegen.cpp_lines import PARALLEL_MIN_WORK, TILE, at_least
from kiln.codegen.cpp_loops import merge_contiguous, split_at_divisors
from kiln.codegen.cpp_reductions import Reductions
from kiln.codegen.cpp_values import (
    STORAGE_TYPE,
    CppUnsupported,
    ctype,
    literal,
    render_compute,
    render_index,
    size_params,
)
from kiln.ir import kernel as k
from kiln.ir.checks import ERROR_PARAM, SLOTS_PER_CHECK
from kiln.ir.index import Sym
from kiln.ir.kernel import compute_dtype
from kiln.ir.sizes import is_symbolic
from kiln.ir.sizes import render as sc

# Rows up to this many elements keep reused values in a local array (stack, L1/L2).
ROW_SCRATCH_LIMIT = 16384


class _Renderer(Reductions):
    def __init__(self, kernel: k.Kernel):
        self.k = kernel
        self.types: dict[str, torch.dtype] = {}
        self.rounded_bf16: set[str] = set()  # values held as floats that are bf16 values already
        self.lines: list[str] = []
        self.block_partial: dict[str, str] = {}  # a sum's accumulator -> its block partial, in a block
        self.hoisted: set[int] = set()  # statements (by id) emitted before the loops they belong to
        self.per_row: dict[int, list[k.Stmt]] = {}  # a loop stage (by id) -> its row-invariant statements
        self.staged: dict[int, str] = {}  # a transposed load (by id) -> the tile element it reads instead
        self.in_bounds: set[int] = set()  # bounds checks (by id) known to hold in the loop being emitted
        self.simd_pragma = True  # whether the loop along a line has a SIMD pragma of its own

    def emit(self, depth: int, text: str, checks: set[int] | None = None) -> None:
        """checks: the error sites a loop's pragma reduces (default: every one, since any
        loop may see an error); a vector loop pays for each at every line it runs."""
        if text.startswith("#pragma omp") and self.k.checks:
            sites = range(len(self.k.checks)) if checks is None else sorted(checks)
            text += "".join(f" reduction(|:{ERROR_PARAM}{i}_hit) reduction(max:{ERROR_PARAM}{i}_value)"
                            for i in sites)
        self.lines.append("  " * depth + text)

    def stmt(self, s: k.Stmt, depth: int) -> None:
        if isinstance(s, k.Load):
            t = compute_dtype(s.dtype)
            value = self.staged.get(id(s)) or f"{s.buf}[{render_index(s.index)}]"
            if s.dtype is torch.bfloat16:
                value = f"kiln_from_bf16({value})"
            elif s.dtype is torch.float16:
                value = f"(float){value}"
            elif s.dtype is torch.bool:
                value = f"({value} != 0)"
            if s.mask:
                value = f"({s.mask} ? {value} : ({ctype(t)})0)"
            self.types[s.out] = s.dtype
            if s.dtype is torch.bfloat16:
                self.rounded_bf16.add(s.out)
            self.emit(depth, f"{ctype(t)} {s.out} = {value};")
        elif isinstance(s, k.Const):
            self.types[s.out] = s.dtype
            self.emit(depth, f"const {ctype(s.dtype)} {s.out} = {literal(s.value, s.dtype)};")
        elif isinstance(s, k.IndexValue):
            self.types[s.out] = torch.int64
            self.emit(depth, f"int64_t {s.out} = {render_index(s.index)};")
        elif isinstance(s, k.InBounds) and id(s) in self.in_bounds:
            self.types[s.out] = torch.bool
            self.emit(depth, f"const bool {s.out} = true;")
        elif isinstance(s, k.InBounds):
            self.types[s.out] = torch.bool
            idx = render_index(s.index)
            self.emit(depth, f"bool {s.out} = (0 <= ({idx})) && (({idx}) < {sc(s.size)});")
        elif isinstance(s, k.Compute):
            expr = render_compute(s, [self.types[a] for a in s.args])
            self.types[s.out] = s.dtype
            if s.dtype is torch.bfloat16 and (k.rounds_result(s) or s.fn == "cast"):
                self.rounded_bf16.add(s.out)
            self.emit(depth, f"{ctype(s.dtype)} {s.out} = {expr};")
        elif isinstance(s, k.Reduce):
            self.reduce_update(s, depth)
        elif isinstance(s, k.Flag):
            self.flag(s, depth)
        elif isinstance(s, k.Store):
            value = s.value
            if s.dtype is torch.bfloat16:  # a value rounded already keeps its upper half
                value = f"kiln_bf16_bits({value})" if value in self.rounded_bf16 else f"kiln_to_bf16({value})"
            elif s.dtype is torch.float16:
                value = f"(_Float16){value}"
            elif compute_dtype(self.types[s.value]) != s.dtype:
                value = f"({STORAGE_TYPE[s.dtype]}){value}"
            self.emit(depth, f"{s.buf}[{render_index(s.index)}] = {value};")

    def flag(self, s: k.Flag, depth: int) -> None:
        """Errors are accumulated like reductions (a store under a condition would keep the
        loop from vectorizing): whether any point saw one, and the largest offending value."""
        hit, value = f"{ERROR_PARAM}{s.site}_hit", f"{ERROR_PARAM}{s.site}_value"
        self.emit(depth, f"{hit} |= {s.cond};")
        # a max of a select, which vectorizes as the reduction clause's max does
        offending = f"({s.cond} ? (int64_t){s.value} : std::numeric_limits<int64_t>::min())"
        self.emit(depth, f"{value} = std::max({value}, {offending});")

    def checks_inside(self) -> set[int]:
        """The error sites checked inside the loops (not hoisted out of them)."""
        return {s.site for st in self.k.stages for s in st.body
                if isinstance(s, k.Flag) and id(s) not in self.hoisted}

    def error_locals(self) -> None:
        for site in range(len(self.k.checks)):
            self.emit(1, f"int64_t {ERROR_PARAM}{site}_hit = 0;")
            self.emit(1, f"int64_t {ERROR_PARAM}{site}_value = std::numeric_limits<int64_t>::min();")

    def report_errors(self) -> None:
        """One writer, after all loops: the kernel's error buffer (see kiln.ir.checks)."""
        for site in range(len(self.k.checks)):
            slot = SLOTS_PER_CHECK * site
            self.emit(1, f"if ({ERROR_PARAM}{site}_hit) {{ {ERROR_PARAM}[{slot}] = 1; "
                         f"{ERROR_PARAM}[{slot + 1}] = {ERROR_PARAM}{site}_value; }}")

    def stage_tiles(self, xj: Sym, xi: Sym, ends, depth: int) -> None:
        """Copies each transposed load's tile into a local array, reading the buffer's lines
        whole, so that the tile's loop reads it contiguously. ends(sym): where the tile stops
        (None: a whole tile)."""
        for s in cpp_lines.transposed_loads(self.k, xj, xi):
            self.staged[id(s)] = f"tile_{s.out}[{xj.name} - {xj.name}b][{xi.name} - {xi.name}b]"
            for text in cpp_lines.tile_copy(s, STORAGE_TYPE[s.dtype], xj, xi, ends):
                self.emit(depth, text)

    def own_statements(self, ids: set[int], depth: int) -> None:
        """The statements of ids (a line's own), in the kernel's order."""
        for stage in self.k.stages:
            for s in stage.body:
                if id(s) in ids:
                    self.stmt(s, depth)

    def line(self, line_loops: list[tuple], simd_loop: tuple | None, per_line: set[int] | None,
             depth: int) -> None:
        """The loops inside the parallel ones (over a tile's lines, then along a line) and the
        body. per_line: the line's own statements, emitted before the loop along it (None:
        emitted already)."""
        kern = self.k
        for name, start, stop in line_loops:
            self.emit(depth, f"for (int64_t {name} = {start}; {name} < {stop}; ++{name}) {{")
            depth += 1
        self.own_statements(per_line or set(), depth)
        if simd_loop:
            if self.simd_pragma:
                self.emit(depth, "#pragma omp simd", self.checks_inside())
            name, start, stop = simd_loop
            self.emit(depth, f"for (int64_t {name} = {start}; {name} < {stop}; ++{name}) {{")
            depth += 1
        for scratch in kern.scratch:
            row = sc(kern.reduce_numel)
            self.emit(depth, f"alignas(64) {ctype(scratch.dtype)} {scratch.name}[{row}];")
        for stage in kern.stages:
            if stage.loop and kern.reduce:
                self.loop_stage(stage, depth)
            else:
                for s in stage.body:
                    if id(s) not in self.hoisted:
                        self.stmt(s, depth)
        for _ in range(len(line_loops) + (simd_loop is not None)):
            depth -= 1
            self.emit(depth, "}")

    def tiles(self, xj: Sym, xi: Sym, per_line: set[int], depth: int) -> None:
        """A tile of a transposing kernel, in each of its variants (cpp_lines.tile_variants)."""
        variants = cpp_lines.tile_variants(xj, xi)
        for cond, ends, whole in variants:
            if len(variants) > 1:
                self.emit(depth, f"if ({cond}) {{" if cond else "} else {")
            inner = depth + (len(variants) > 1)
            self.stage_tiles(xj, xi, None if whole else ends, inner)
            lines, along = (xj.name, f"{xj.name}b", ends(xj)), (xi.name, f"{xi.name}b", ends(xi))
            self.line([lines], along, per_line, inner)
        if len(variants) > 1:
            self.emit(depth, "}")

    def peeled(self, simd_loop: tuple, peel: tuple, per_line: set[int], depth: int) -> None:
        """A line whose bounds checks along it hold on a middle range of it (a padded window's
        reads): that range runs without them (their arithmetic and the selects they feed);
        its ends, and lines whose own checks fail, run as written."""
        line_masks, along = peel
        self.own_statements(per_line, depth)
        name, start, stop = simd_loop
        inner = depth
        if line_masks:
            self.emit(depth, f"if ({' && '.join(line_masks)}) {{")
            inner += 1
            # true throughout this branch: the loops below read them as constants
            self.emit(inner, "const bool " + ", ".join(f"{m} = true" for m in line_masks) + ";")
        lo, hi, declarations = cpp_lines.middle_range(name, start, stop, along)
        for text in declarations:
            self.emit(inner, text)
        for first, end, checked in ((start, lo, True), (lo, hi, False), (hi, stop, True)):
            if first == end:  # known empty
                continue
            self.in_bounds = set() if checked else {id(s) for s, _, _ in along}
            self.line([], (name, first, end), None, inner)
        self.in_bounds = set()
        if line_masks:
            self.emit(depth, "} else {")
            self.line([], simd_loop, None, inner)
            self.emit(depth, "}")

    def render(self) -> str:
        kern = self.k
        if k.column_reduction(kern):
            return self.render_column()
        params = ", ".join(
            f"{'' if p.is_output else 'const '}{STORAGE_TYPE[p.dtype]}* __restrict__ {p.name}"
            for p in kern.params) + size_params(kern)
        for p in kern.params:
            if p.dtype not in STORAGE_TYPE:
                raise CppUnsupported(f"dtype {p.dtype}")
        self.emit(0, f'extern "C" void {kern.name}({params}) {{')
        self.error_locals()
        hoisted = loop_invariant(kern) if not kern.reduce else set()
        for stage in kern.stages:  # once, before the loops (an optimizer's bias corrections)
            for s in stage.body:
                if id(s) in hoisted:
                    self.stmt(s, 1)
        row = kern.reduce_numel if is_symbolic(kern.reduce_numel) else max(kern.reduce_numel, 1)
        work = kern.outer_numel * row
        parallel = at_least(work, PARALLEL_MIN_WORK) and at_least(kern.outer_numel, 2)
        outer = list(kern.outer)
        pointwise = not kern.reduce
        simd_outer = outer[-1:] if pointwise and outer else []
        par_dims = outer[:-1] if simd_outer else outer
        # the parallel loops as (variable, start, stop, step)
        par_loops = [(sym.name, "0", sc(sym.extent), 1) for sym in par_dims]
        simd_loop = (simd_outer[0].name, "0", sc(simd_outer[0].extent)) if simd_outer else None
        tiled = cpp_lines.transpose_tile(kern) if pointwise else None
        if tiled is not None:  # a transposing kernel walks tiles: both sides' lines stay in L1
            par_loops = [loop for loop in par_loops if loop[0] != tiled.name]
            par_loops += [(f"{sym.name}b", "0", sc(sym.extent), TILE) for sym in (tiled, simd_outer[0])]
        depth = 1
        if parallel and par_loops:
            collapse = f" collapse({len(par_loops)})" if len(par_loops) > 1 else ""
            self.emit(depth, f"#pragma omp parallel for{collapse}")
        elif parallel and simd_outer:
            self.emit(depth, "#pragma omp parallel for simd")
        for name, start, stop, step in par_loops:
            increment = f"++{name}" if step == 1 else f"{name} += {step}"
            self.emit(depth, f"for (int64_t {name} = {start}; {name} < {stop}; {increment}) {{")
            depth += 1
        # a line's (or a row's) own values once, before the loop along it (or the row's stages)
        along = {simd_outer[0]} if simd_outer and par_dims else set(kern.reduce) if kern.reduce else None
        per_line = line_invariant(kern, along) - hoisted if along else set()
        self.per_row = row_invariant(kern, values_of(kern, hoisted | per_line)) if kern.reduce else {}
        self.hoisted = hoisted | per_line | {id(s) for stmts in self.per_row.values() for s in stmts}
        self.simd_pragma = bool(par_dims) or not parallel
        if tiled is not None:
            self.tiles(tiled, simd_outer[0], per_line, depth)
        elif simd_outer and self.simd_pragma and (peel := cpp_lines.interior(kern, simd_outer[0], per_line)):
            self.peeled(simd_loop, peel, per_line, depth)
        else:
            self.line([], simd_loop, per_line, depth)
        for _ in par_loops:
            depth -= 1
            self.emit(depth, "}")
        self.report_errors()
        self.emit(0, "}")
        return "\n".join(self.lines)


def render_kernel(kernel: k.Kernel) -> str:
    """The kernel as a C++ function; the build puts the prelude (cpp_prelude.h) before it."""
    return _Renderer(split_at_divisors(merge_contiguous(kernel))).render()

"""The C++ matmul template (ir/matmul.py): the product computed block by block into a float32
tile, then the epilogue run over the tile as the point-wise kernel it replaces runs (a SIMD
loop along the columns) before anything is stored.

Two loop forms, by the operands' layouts:
- "dot": both operands contiguous along k (x @ W.t(), a Linear's weight as it is stored).
  Each output is a dot product along k, a SIMD reduction; a block of DOT_ROWS x COLUMNS
  outputs shares its loads of A and B, and a row left over (a product of one row, as a decode
  step's) computes ROW_COLUMNS outputs together.
- "rows": B contiguous along n. A block of ROWS rows and PANEL columns accumulates
  A[i, k] * B[k, j0:j0 + PANEL] over k, a SIMD loop along the columns; each loaded row of B
  serves ROWS rows.
Other layouts have no form (passes/matmul_choice.py keeps them in ATen; a forced template runs
a scalar loop). Threads take blocks of columns and rows, where the product is large enough.
"""

from __future__ import annotations

import torch

from kiln.codegen import cpp
from kiln.codegen.cpp_lines import PARALLEL_MIN_WORK
from kiln.codegen.cpp_values import STORAGE_TYPE, CppUnsupported, ctype, round_to
from kiln.ir import kernel as k
from kiln.ir.matmul import MatmulKernel, Operand, loop_form

# a "dot" block: DOT_ROWS x COLUMNS outputs, each a SIMD sum along k (eight vector accumulators);
# a single row's block: ROW_COLUMNS outputs (as many accumulators, to hide the FMAs' latency)
DOT_ROWS, COLUMNS, ROW_COLUMNS = 2, 4, 8
ROWS, PANEL = 4, 64  # a "rows" block: ROWS x PANEL float32 accumulators, sixteen 512-bit registers


def _element(op: Operand, rows: str, cols: str) -> str:
    return f"{op.param}[{op.offset} + ({rows}) * {op.stride[0]} + ({cols}) * {op.stride[1]}]"


def _as_float(expr: str, dtype: torch.dtype) -> str:
    if dtype is torch.bfloat16:
        return f"kiln_from_bf16({expr})"
    return f"(float){expr}"


class _TemplateRenderer(cpp._Renderer):
    def __init__(self, kernel: MatmulKernel):
        super().__init__(kernel)
        self.mm = kernel
        self.dtypes = {p.name: p.dtype for p in kernel.params}

    def stmt(self, s: k.Stmt, depth: int) -> None:
        if isinstance(s, k.Load) and s.buf == self.mm.product:
            self.types[s.out] = s.dtype
            if s.dtype is torch.bfloat16:
                self.rounded_bf16.add(s.out)
            self.emit(depth, f"{ctype(k.compute_dtype(s.dtype))} {s.out} = product;")
            return
        super().stmt(s, depth)

    def _load(self, op: Operand, rows: str, cols: str) -> str:
        return _as_float(_element(op, rows, cols), self.dtypes[op.param])

    def epilogue(self, row: str, col: str, value: str, depth: int) -> None:
        """The epilogue's statements at element (row, col), whose product is value."""
        mm = self.mm
        self.emit(depth, "{")
        if mm.bias is not None:
            value = f"{value} + {self._load(mm.bias, row, col)}"
        self.emit(depth + 1, f"const float product = {round_to(value, mm.product_dtype)};")
        outer = list(mm.outer)
        if tuple(s.extent for s in outer) == (mm.m, mm.n):
            self.emit(depth + 1, f"const int64_t {outer[0].name} = {row};")
            self.emit(depth + 1, f"const int64_t {outer[1].name} = {col};")
        else:  # the epilogue's points in row-major order are the product's elements
            self.emit(depth + 1, f"int64_t flat = ({row}) * {mm.n} + ({col});")
            for sym in reversed(outer):
                self.emit(depth + 1, f"const int64_t {sym.name} = flat % {sym.extent}; flat /= {sym.extent};")
        for stage in mm.stages:
            for s in stage.body:
                self.stmt(s, depth + 1)
        self.emit(depth, "}")

    def render(self) -> str:
        mm = self.mm
        for p in mm.params:
            if p.dtype not in STORAGE_TYPE:
                raise CppUnsupported(f"dtype {p.dtype}")
        params = ", ".join(f"{'' if p.is_output else 'const '}{STORAGE_TYPE[p.dtype]}* __restrict__ {p.name}"
                           for p in mm.params)
        self.emit(0, f'extern "C" void {mm.name}({params}) {{')
        {"dot": self._dot, "rows": self._rows, None: self._scalar}[loop_form(mm)]()
        self.emit(0, "}")
        return "\n".join(self.lines)

    def _parallel(self, blocks: int) -> None:
        """Threads over the two outer loops, where there are blocks to share and work enough."""
        if blocks > 1 and self.mm.m * self.mm.n * self.mm.k >= PARALLEL_MIN_WORK:
            self.emit(1, "#pragma omp parallel for collapse(2) schedule(static)")

    def _blocks(self, rows: int) -> None:
        """The loops over blocks of `rows` rows x PANEL columns (parallel where the work is
        large enough), each with its float32 tile `acc` and its extents `height`, `width`."""
        mm = self.mm
        panels, row_blocks = -(-mm.n // PANEL), -(-mm.m // rows)
        self._parallel(panels * row_blocks)
        self.emit(1, f"for (int64_t p = 0; p < {panels}; ++p) {{")
        self.emit(2, f"for (int64_t ib = 0; ib < {row_blocks}; ++ib) {{")
        self.emit(3, f"const int64_t j0 = p * {PANEL}, i0 = ib * {rows};")
        self.emit(3, f"const int64_t width = {mm.n} - j0 < {PANEL} ? {mm.n} - j0 : {PANEL};")
        self.emit(3, f"const int64_t height = {mm.m} - i0 < {rows} ? {mm.m} - i0 : {rows};")
        self.emit(3, f"float acc[{rows}][{PANEL}] = {{}};")

    def _tile_epilogue(self) -> None:
        """The epilogue over the block's tile, a SIMD loop along its columns (as the point-wise
        kernel it replaces runs), then the blocks' loops closed."""
        self.emit(3, "for (int64_t r = 0; r < height; ++r) {")
        self.emit(4, "#pragma omp simd")
        self.emit(4, "for (int64_t c = 0; c < width; ++c) {")
        self.epilogue("i0 + r", "j0 + c", "acc[r][c]", 5)
        self.emit(4, "}")
        self.emit(3, "}")
        self.emit(2, "}")
        self.emit(1, "}")

    def _dot_one(self, row: str, col: str, depth: int) -> None:
        mm = self.mm
        self.emit(depth, "{")
        self.emit(depth + 1, "float s = 0.0f;")
        self.emit(depth + 1, "#pragma omp simd reduction(+:s)")
        a, b = self._load(mm.a, f"i0 + {row}", "kk"), self._load(mm.b, "kk", f"j0 + {col}")
        self.emit(depth + 1, f"for (int64_t kk = 0; kk < {mm.k}; ++kk) s += {a} * {b};")
        self.emit(depth + 1, f"acc[{row}][{col}] = s;")
        self.emit(depth, "}")

    def _dot_block(self, rows: int, columns: int, row0: str, depth: int) -> None:
        """acc[row0 + r][c0 + c] for a block of rows x columns outputs, each a SIMD sum along k:
        each loaded element of A serves `columns` outputs, each of B `rows`."""
        mm = self.mm
        sums = {(r, c): f"s{r}_{c}" for r in range(rows) for c in range(columns)}
        self.emit(depth, f"float {' = 0.0f, '.join(sums.values())} = 0.0f;")
        self.emit(depth, f"#pragma omp simd reduction(+:{','.join(sums.values())})")
        self.emit(depth, f"for (int64_t kk = 0; kk < {mm.k}; ++kk) {{")
        for r in range(rows):
            self.emit(depth + 1, f"const float a{r} = {self._load(mm.a, f'i0 + {row0} + {r}', 'kk')};")
        for c in range(columns):
            self.emit(depth + 1, f"const float b{c} = {self._load(mm.b, 'kk', f'j0 + c0 + {c}')};")
        for (r, c), s in sums.items():
            self.emit(depth + 1, f"{s} += a{r} * b{c};")
        self.emit(depth, "}")
        for (r, c), s in sums.items():
            self.emit(depth, f"acc[{row0} + {r}][c0 + {c}] = {s};")

    def _dot(self) -> None:
        """Blocks of DOT_ROWS x COLUMNS outputs; a block's last rows (a product of one row,
        as a decode step's) one at a time, ROW_COLUMNS outputs together."""
        self._blocks(DOT_ROWS)
        self.emit(3, f"if (height == {DOT_ROWS}) {{")
        self.emit(4, "int64_t c0 = 0;")
        self.emit(4, f"for (; c0 + {COLUMNS} <= width; c0 += {COLUMNS}) {{")
        self._dot_block(DOT_ROWS, COLUMNS, "0", 5)
        self.emit(4, "}")
        self.emit(4, "for (int64_t c = c0; c < width; ++c)")
        self.emit(5, f"for (int64_t r = 0; r < {DOT_ROWS}; ++r)")
        self._dot_one("r", "c", 6)
        self.emit(3, "} else {")
        self.emit(4, "for (int64_t r = 0; r < height; ++r) {")
        self.emit(5, "int64_t c0 = 0;")
        self.emit(5, f"for (; c0 + {ROW_COLUMNS} <= width; c0 += {ROW_COLUMNS}) {{")
        self._dot_block(1, ROW_COLUMNS, "r", 6)
        self.emit(5, "}")
        self.emit(5, "for (int64_t c = c0; c < width; ++c)")
        self._dot_one("r", "c", 6)
        self.emit(4, "}")
        self.emit(3, "}")
        self._tile_epilogue()

    def _rows(self) -> None:
        self._blocks(ROWS)
        # whole blocks with constant trip counts keep the accumulators in registers
        self.emit(3, f"if (height == {ROWS} && width == {PANEL}) {{")
        self._rows_loop(4, str(ROWS), str(PANEL))
        self.emit(3, "} else {")
        self._rows_loop(4, "height", "width")
        self.emit(3, "}")
        self._tile_epilogue()

    def _rows_loop(self, depth: int, height: str, width: str) -> None:
        mm = self.mm
        self.emit(depth, f"for (int64_t kk = 0; kk < {mm.k}; ++kk) {{")
        self.emit(depth + 1, f"for (int64_t r = 0; r < {height}; ++r) {{")
        self.emit(depth + 2, f"const float a = {self._load(mm.a, 'i0 + r', 'kk')};")
        self.emit(depth + 2, "#pragma omp simd")
        self.emit(depth + 2, f"for (int64_t c = 0; c < {width}; ++c) "
                             f"acc[r][c] += a * {self._load(mm.b, 'kk', 'j0 + c')};")
        self.emit(depth + 1, "}")
        self.emit(depth, "}")

    def _scalar(self) -> None:
        mm = self.mm
        self._parallel(mm.m * mm.n)
        self.emit(1, f"for (int64_t i = 0; i < {mm.m}; ++i) {{")
        self.emit(2, f"for (int64_t j = 0; j < {mm.n}; ++j) {{")
        self.emit(3, "float s = 0.0f;")
        self.emit(3, f"for (int64_t kk = 0; kk < {mm.k}; ++kk) "
                     f"s += {self._load(mm.a, 'i', 'kk')} * {self._load(mm.b, 'kk', 'j')};")
        self.epilogue("i", "j", "s", 3)
        self.emit(2, "}")
        self.emit(1, "}")


def render_template(kernel: MatmulKernel) -> str:
    return _TemplateRenderer(kernel).render()

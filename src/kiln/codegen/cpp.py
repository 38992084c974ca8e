"""C++ (OpenMP) renderer for kernel IR.

The outer domain becomes nested loops: parallel over the leading outer dimensions, a SIMD
loop innermost. Each stage of a reduction kernel is a loop over the reduction domain whose
innermost dimension is a SIMD loop with the accumulators as OpenMP reductions.
"""

from __future__ import annotations

from functools import partial

import torch

from kiln.codegen import base, cpp_lines
from kiln.codegen.cpp_hoisting import computing, line_invariant, loop_invariant, row_invariant, values_of
from kiln.codegen.cpp_lines import TILE, at_least
from kiln.codegen.cpp_loops import merge_contiguous, split_at_divisors
from kiln.ir import kernel as k
from kiln.ir.checks import ERROR_PARAM, SLOTS_PER_CHECK
from kiln.ir.index import Expr, Sym
from kiln.ir.kernel import compute_dtype
from kiln.ir.ops import LIBRARY_MATH
from kiln.ir.sizes import is_symbolic
from kiln.ir.sizes import render as sc

# Rows up to this many elements keep reused values in a local array (stack, L1/L2).
ROW_SCRATCH_LIMIT = 16384
COLUMN_BLOCK = 64  # neighbouring outputs a column reduction computes together

# A floating-point sum adds this many terms (per SIMD lane: a sixteenth) into a fresh partial
# sum, then the partial into its total: a running sum's rounding error grows with its length.
SUM_BLOCK = 1024

# Below this many points per kernel, threads cost more than they save.
PARALLEL_MIN_WORK = 1 << 15

STORAGE_TYPE = {
    torch.float32: "float", torch.float64: "double", torch.bfloat16: "uint16_t",
    torch.float16: "_Float16", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "uint8_t",
}
# bool tensors are read as bytes and compared with 0: loads of C++ bool block vectorization.
COMPUTE_TYPE = {**STORAGE_TYPE, torch.bool: "bool"}


class CppUnsupported(Exception):
    pass


def ctype(dtype: torch.dtype) -> str:
    """The C type a value of this dtype is computed in."""
    dtype = compute_dtype(dtype)
    if dtype not in COMPUTE_TYPE:
        raise CppUnsupported(f"dtype {dtype} has no C++ type")
    return COMPUTE_TYPE[dtype]


def render_index(e: Expr) -> str:
    return base.render_index(e, "/", sc)


def _size_params(kern: k.Kernel) -> str:
    """The kernel's size parameters (ks0, ks1, ...), after its buffers."""
    return "".join(f", const int64_t ks{i}" for i in range(len(kern.sizes)))


def literal(value, dtype: torch.dtype) -> str:
    if is_symbolic(value):  # a size of the shape family (a mean's count)
        return f"(({ctype(dtype)})({sc(value)}))"
    value = base.held_value(value, dtype)
    dtype = compute_dtype(dtype)
    if dtype is torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        if v != v:
            text = "std::numeric_limits<double>::quiet_NaN()"
        elif v in (float("inf"), float("-inf")):
            text = ("-" if v < 0 else "") + "std::numeric_limits<double>::infinity()"
        else:
            text = repr(v)
        return f"({ctype(dtype)})({text})"
    return f"(({ctype(dtype)}){int(value)}LL)" if abs(int(value)) < 2**63 else "0"


def _round_to(expr: str, dtype: torch.dtype) -> str:
    if dtype is torch.bfloat16:
        return f"kiln_round_bf16({expr})"
    if dtype is torch.float16:
        return f"kiln_round_f16({expr})"
    return expr


def render_compute(s: k.Compute, arg_types: list[torch.dtype]) -> str:
    # bf16/f16 results are rounded after each op, as eager rounds them: skipping it would
    # let a tiny difference flip a comparison, a floor or a cast to int
    expr = _render_compute(s, arg_types)
    return _round_to(expr, s.dtype) if k.rounds_result(s) else expr


def _render_compute(s: k.Compute, arg_types: list[torch.dtype]) -> str:
    t = compute_dtype(arg_types[0]) if arg_types else compute_dtype(s.dtype)
    text = base.render_op(_OPS, s, t, arg_types)
    if text is None:
        raise CppUnsupported(f"no C++ rendering of {s.fn} on {t}")
    return text


def _cast(a, c: base.OpContext) -> str:
    src, dst = c.arg_types[0], c.out
    if dst is torch.bool:
        return f"({a[0]} != 0)"
    if dst in (torch.bfloat16, torch.float16):
        return _round_to(f"(float){a[0]}", dst)
    if dst is torch.uint8 and src.is_floating_point:  # through int64, as eager converts
        return f"(({ctype(dst)})(int64_t){a[0]})"
    return f"(({ctype(dst)}){a[0]})"


def _float_fn(name: str, otherwise: base.Rule | None = None) -> base.Rule:
    """name(a) on float (libm's float function), its double form (no trailing f) on double;
    otherwise on other types."""
    return base.on_fp(lambda a, c: f"{name if c.t is torch.float32 else name[:-1]}({a[0]})", otherwise)


def _on_bool(value: base.Rule, otherwise: base.Rule) -> base.Rule:
    return lambda a, c: value(a, c) if c.t is torch.bool else otherwise(a, c)


_FLOAT_FN = {  # name -> libm's function for float
    "exp": "expf", "exp2": "exp2f", "log": "logf", "log2": "log2f", "log10": "log10f",
    "log1p": "log1pf", "expm1": "expm1f", "sqrt": "sqrtf", "sin": "sinf", "cos": "cosf",
    "tan": "tanf", "asin": "asinf", "acos": "acosf", "atan": "atanf", "sinh": "sinhf",
    "cosh": "coshf", "tanh": "tanhf", "asinh": "asinhf", "acosh": "acoshf", "atanh": "atanhf",
    "erf": "erff", "erfc": "erfcf",
}
_OPS: dict[str, base.Rule] = {
    "cast": _cast,
    **{fn: base.infix(op) for fn, op in {**base.INFIX, "div": "/"}.items()},
    "add": base.infix("+", "||"),
    "mul": base.infix("*", "&&"),
    **{fn: _float_fn(name) for fn, name in _FLOAT_FN.items()},
    "abs": _float_fn("fabsf", _on_bool(base.first_arg, lambda a, c: f"({a[0]} < 0 ? -{a[0]} : {a[0]})")),
    # on integers, rounding is the identity
    "floor": _float_fn("floorf", base.first_arg),
    "ceil": _float_fn("ceilf", base.first_arg),
    "round": _float_fn("nearbyintf", base.first_arg),
    "trunc": _float_fn("truncf", base.first_arg),
    "neg": lambda a, c: f"(-{a[0]})",
    "rsqrt": lambda a, c: f"(({ctype(c.t)})1 / std::sqrt({a[0]}))",
    "reciprocal": lambda a, c: f"(({ctype(c.t)})1 / {a[0]})",
    "sigmoid": lambda a, c: f"kiln_sigmoid({a[0]})",
    "gelu": lambda a, c: f"kiln_gelu({a[0]})",
    "sign": _on_bool(base.first_arg, lambda a, c: f"kiln_sign({a[0]})"),
    "isnan": lambda a, c: f"({a[0]} != {a[0]})",
    "isinf": lambda a, c: f"std::isinf({a[0]})",
    "logical_not": lambda a, c: f"(!{a[0]})",
    "bitwise_not": _on_bool(lambda a, c: f"(!{a[0]})", lambda a, c: f"(~{a[0]})"),
    "logical_and": lambda a, c: f"((bool){a[0]} && (bool){a[1]})",
    "logical_or": lambda a, c: f"((bool){a[0]} || (bool){a[1]})",
    "logical_xor": lambda a, c: f"((bool){a[0]} != (bool){a[1]})",
    "maximum": _on_bool(base.infix("||"), lambda a, c: f"kiln_maximum<{ctype(c.t)}>({a[0]}, {a[1]})"),
    "minimum": _on_bool(base.infix("&&"), lambda a, c: f"kiln_minimum<{ctype(c.t)}>({a[0]}, {a[1]})"),
    "where": lambda a, c: f"({a[0]} ? {a[1]} : {a[2]})",
    "lshift": lambda a, c: None if c.fp else f"kiln_lshift<{ctype(c.t)}>({a[0]}, {a[1]})",
    "rshift": lambda a, c: None if c.fp else f"kiln_rshift<{ctype(c.t)}>({a[0]}, {a[1]})",
    "floordiv": base.on_fp(lambda a, c: f"kiln_floordiv_fp<{ctype(c.t)}>({a[0]}, {a[1]})",
                           lambda a, c: f"kiln_floordiv({a[0]}, {a[1]})"),
    "truncdiv": base.on_fp(lambda a, c: f"std::trunc({_round_like(f'{a[0]} / {a[1]}', c.arg_types)})",
                           lambda a, c: f"kiln_truncdiv({a[0]}, {a[1]})"),
    "remainder": base.on_fp(lambda a, c: f"kiln_remainder_fp<{ctype(c.t)}>({a[0]}, {a[1]})",
                            lambda a, c: f"kiln_remainder({a[0]}, {a[1]})"),
    "fmod": base.on_fp(lambda a, c: f"std::fmod({a[0]}, {a[1]})", lambda a, c: f"kiln_fmod({a[0]}, {a[1]})"),
    # powf, not std::pow, on float: it has a SIMD variant
    "pow": base.on_fp(lambda a, c: f"{'powf' if c.t is torch.float32 else 'pow'}({a[0]}, {a[1]})",
                      lambda a, c: f"kiln_pow({a[0]}, {a[1]})"),
    "atan2": lambda a, c: f"std::atan2({a[0]}, {a[1]})",
    "copysign": lambda a, c: f"std::copysign({a[0]}, {a[1]})",
    # (seed, offset): the prelude's Philox
    "philox_uniform": lambda a, c: f"kiln_philox_uniform({a[0]}, {a[1]})",
    "philox_normal": lambda a, c: f"kiln_philox_normal({a[0]}, {a[1]})",
}


def _round_like(expr: str, arg_types: list[torch.dtype]) -> str:
    """expr rounded to the operands' dtype when all are bf16 (or all f16): eager rounds there."""
    if arg_types and all(t is torch.bfloat16 for t in arg_types):
        return f"kiln_round_bf16({expr})"
    if arg_types and all(t is torch.float16 for t in arg_types):
        return f"kiln_round_f16({expr})"
    return f"({expr})"


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


class _Renderer:
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
            block = f"{last.name}_block"
            self.emit(inner, f"for (int64_t {block} = 0; {block} < {sc(last.extent)}; "
                             f"{block} += {SUM_BLOCK}) {{")
            inner += 1
            for r in sums:
                self.emit(inner, f"{ctype(compute_dtype(r.dtype))} {r.out}_block = 0;")
            start, stop = block, f"std::min<int64_t>({block} + {SUM_BLOCK}, {sc(last.extent)})"
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
            for p in kern.params) + _size_params(kern)
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
                    block = f"{last.name}_block"
                    self.emit(inner, f"for (int64_t {block} = 0; {block} < {sc(last.extent)}; "
                                     f"{block} += {SUM_BLOCK}) {{")
                    inner += 1
                    for r in sums:
                        self.emit(inner, f"{ctype(compute_dtype(r.dtype))} {r.out}_block[{xb}];")
                        self.emit(inner, f"for (int64_t xi = 0; xi < xn; ++xi) {r.out}_block[xi] = 0;")
                    start, stop = block, f"std::min<int64_t>({block} + {SUM_BLOCK}, {sc(last.extent)})"
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
            for p in kern.params) + _size_params(kern)
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


def render_kernel(kernel: k.Kernel) -> str:
    """The kernel as a C++ function; the build puts the prelude (cpp_prelude.h) before it."""
    return _Renderer(split_at_divisors(merge_contiguous(kernel))).render()

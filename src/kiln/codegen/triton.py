"""Triton renderer for kernel IR.

A point-wise kernel is a 1-D block of XBLOCK outer points. A reduction kernel is a 2-D tile
of XBLOCK rows by RBLOCK row elements: persistent (the whole row in one tile, so values kept
for later stages stay in registers) when the row fits, looped over RBLOCK chunks otherwise.
Low-precision floats are computed in float32, as eager does.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from kiln.codegen import base
from kiln.codegen.triton_launch import SPLIT_EDGE, is_persistent, one_tile_variant, row_tiled, split_rows
from kiln.codegen.triton_sizes import is_family, size_names, sz
from kiln.ir import index as ix
from kiln.ir import kernel as k
from kiln.ir.checks import ERROR_PARAM, SLOTS_PER_CHECK
from kiln.ir.index import Expr, Sym
from kiln.ir.kernel import compute_dtype
from kiln.ir.sizes import (
    NeedsNumber,
    is_symbolic,
    known_divides,
    known_eq,
)
from kiln.passes.kernel_cse import merge_across_stages

# An element-wise kernel's mask must not change inside a 16-byte vector (at most 16 elements)
# for Triton to load whole vectors.
MASK_GRAIN = 16

TL_TYPE = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.bfloat16: "tl.bfloat16",
    torch.float16: "tl.float16", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


class TritonUnsupported(Exception):
    pass


def tl_type(dtype: torch.dtype) -> str:
    dtype = compute_dtype(dtype)
    if dtype not in TL_TYPE:
        raise TritonUnsupported(f"dtype {dtype} has no Triton type")
    return TL_TYPE[dtype]


def render_index(e: Expr) -> str:
    return base.render_index(e, "//", sz)


def literal(value, dtype: torch.dtype) -> str:
    if is_symbolic(value):  # a size of the shape family (a mean's count), converted as eager does
        return _size_literal(value, dtype)
    value = base.held_value(value, dtype)
    t = compute_dtype(dtype)
    if t is torch.bool:
        v = "1" if value else "0"
    elif t.is_floating_point:
        v = float(value)
        if v == 0 and math.copysign(1.0, v) < 0:  # tl.full makes any zero +0.0; 0.0 * -1.0 is -0.0
            return f"(tl.full([1], 0.0, {tl_type(t)}) * -1.0)"
        v = f'float("{v}")' if v != v or v in (float("inf"), float("-inf")) else repr(v)
    else:  # wrapped into the dtype's range, as eager wraps it (uint8 -7 is 249)
        info = torch.iinfo(t)
        v = str((int(value) - info.min) % (info.max - info.min + 1) + info.min)
    return f"tl.full([1], {v}, {tl_type(t)})"


def _size_literal(value, dtype: torch.dtype) -> str:
    t = compute_dtype(dtype)
    count = f"(tl.zeros([1], tl.int64) + {sz(value)})"
    if t is torch.bool:
        return f"({count} != 0)"
    return _round_to(f"{count}.to({tl_type(t)})", dtype)


def _round_to(expr: str, dtype: torch.dtype) -> str:
    if dtype is torch.bfloat16:
        return f"km.round_bf16({expr})"
    if dtype is torch.float16:
        return f"{expr}.to(tl.float16).to(tl.float32)"
    return expr


def render_compute(s: k.Compute, arg_types: list[torch.dtype], only_stored: bool = False) -> str:
    """A result rounded as the kernel IR's rule says; not when it is only stored into buffers
    of its own dtype, whose conversion rounds it the same way."""
    if only_stored and s.fn == "cast" and s.dtype in (torch.bfloat16, torch.float16):
        return f"{s.args[0]}.to(tl.float32)"
    expr = _render_compute(s, arg_types)
    return _round_to(expr, s.dtype) if k.rounds_result(s) and not only_stored else expr


def _render_compute(s: k.Compute, arg_types: list[torch.dtype]) -> str:
    t = compute_dtype(arg_types[-1] if s.fn == "where" else arg_types[0])
    text = base.render_op(_OPS, s, t, arg_types)
    if text is None:
        raise TritonUnsupported(f"no Triton rendering of {s.fn} on {t}")
    return text


def _cast(a, c: base.OpContext) -> str:
    dst = c.out
    if dst is torch.bool:
        return f"({a[0]} != 0)"
    if dst in (torch.bfloat16, torch.float16):
        # through float32, as eager converts (a float64 is rounded twice there too)
        return _round_to(f"{a[0]}.to(tl.float32)", dst)
    if dst is torch.uint8 and c.fp:
        return f"{a[0]}.to(tl.int64).to(tl.uint8)"
    return f"{a[0]}.to({tl_type(dst)})"


# float32 division and square root rounded as IEEE (Triton's defaults are approximate);
# float64 ones are exact already
def _div(x: str, y: str, c: base.OpContext) -> str:
    return f"tl.math.div_rn({x}, {y})" if c.t is torch.float32 else f"({x} / {y})"


def _sqrt(c: base.OpContext) -> str:
    return "tl.sqrt_rn" if c.t is torch.float32 else "tl.sqrt"


def _extreme(fn: str) -> base.Rule:
    """maximum, minimum: eager's NaN if either is NaN, else the first operand on ties (-0.0
    against 0.0)."""
    beats = ">" if fn == "maximum" else "<"

    def rule(a, c):
        if c.t is torch.bool:
            return f"({a[0]} {'|' if fn == 'maximum' else '&'} {a[1]})"
        if c.fp:
            return f"tl.where(({a[1]} {beats} {a[0]}) | ({a[1]} != {a[1]}), {a[1]}, {a[0]})"
        return f"tl.{fn}({a[0]}, {a[1]})"
    return rule


def _truncdiv_fp(a, c: base.OpContext) -> str:
    low = [d for d in c.arg_types if d in (torch.bfloat16, torch.float16)]
    quotient = _div(a[0], a[1], c)
    return f"km.trunc({_round_to(quotient, low[0]) if len(low) == len(c.arg_types) else quotient})"


def _km(name: str, arity: int = 1) -> base.Rule:
    """triton_math's function of that name."""
    return lambda a, c: f"km.{name}({', '.join(a[:arity])})"


_TL_UNARY = {"exp": "tl.exp", "exp2": "tl.exp2", "log": "tl.log", "log2": "tl.log2", "sin": "tl.sin",
             "cos": "tl.cos", "sigmoid": "tl.sigmoid"}
_KM_UNARY = ("tanh", "log1p", "expm1", "erfc", "tan", "sinh", "cosh", "asinh", "acosh", "atanh",
             "asin", "acos", "atan", "log10")
_RANDOM = {"philox_uniform": "tl.rand", "philox_normal": "tl.randn"}
_OPS: dict[str, base.Rule] = {
    "cast": _cast,
    **{fn: base.infix(op) for fn, op in {**base.INFIX, "lshift": "<<", "rshift": ">>"}.items()},
    "add": base.infix("+", "|"),
    "mul": base.infix("*", "&"),
    "div": lambda a, c: _div(a[0], a[1], c),
    "sqrt": base.on_fp(lambda a, c: f"{_sqrt(c)}({a[0]})"),
    **{fn: base.on_fp(lambda a, c, f=f: f"{f}({a[0]})") for fn, f in _TL_UNARY.items()},
    **{fn: base.on_fp(_km(fn)) for fn in _KM_UNARY},
    "erf": base.on_fp(lambda a, c: f"km.erf_f32({a[0]})" if c.t is torch.float32 else f"tl.erf({a[0]})"),
    "gelu": lambda a, c: (f"km.gelu({a[0]})" if c.t is torch.float32
                          else f"({a[0]} * 0.5 * (1.0 + tl.erf({a[0]} * 0.7071067811865476)))"),
    "abs": lambda a, c: f"tl.abs({a[0]})",
    # on integers, rounding is the identity
    "floor": base.on_fp(lambda a, c: f"tl.floor({a[0]})", base.first_arg),
    "ceil": base.on_fp(lambda a, c: f"tl.ceil({a[0]})", base.first_arg),
    "round": base.on_fp(_km("nearbyint"), base.first_arg),
    "trunc": base.on_fp(_km("trunc"), base.first_arg),
    # Triton's unary minus is 0 - x, which makes -(+0.0) +0.0
    "neg": base.on_fp(lambda a, c: f"({a[0]} * -1.0)", lambda a, c: f"(-{a[0]})"),
    "rsqrt": lambda a, c: _div("1.0", f"{_sqrt(c)}({a[0]})", c),
    "reciprocal": lambda a, c: _div("1.0", a[0], c),
    # sign(NaN) is 0 in eager
    "sign": lambda a, c: a[0] if c.t is torch.bool else (
        f"(({a[0]} > 0).to({tl_type(c.t)}) - ({a[0]} < 0).to({tl_type(c.t)}))"),
    "isnan": lambda a, c: f"({a[0]} != {a[0]})",
    "isinf": lambda a, c: f"(tl.abs({a[0]}) == float('inf'))",
    "logical_not": lambda a, c: f"({a[0]} == 0)",
    "bitwise_not": lambda a, c: f"({a[0]} == 0)" if c.t is torch.bool else f"(~{a[0]})",
    "logical_and": lambda a, c: f"(({a[0]} != 0) & ({a[1]} != 0))",
    "logical_or": lambda a, c: f"(({a[0]} != 0) | ({a[1]} != 0))",
    "logical_xor": lambda a, c: f"(({a[0]} != 0) ^ ({a[1]} != 0))",
    "maximum": _extreme("maximum"),
    "minimum": _extreme("minimum"),
    "where": lambda a, c: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    "floordiv": base.on_fp(_km("floordiv_fp", 2), _km("floordiv_int", 2)),
    "truncdiv": base.on_fp(_truncdiv_fp, _km("truncdiv_int", 2)),
    "remainder": base.on_fp(_km("remainder_fp", 2), _km("remainder_int", 2)),
    "fmod": base.on_fp(lambda a, c: f"({a[0]} % {a[1]})", _km("fmod_int", 2)),
    "pow": base.on_fp(_km("pow", 2), _km("pow_int", 2)),
    "atan2": base.on_fp(_km("atan2", 2)),
    "copysign": base.on_fp(_km("copysign", 2)),
    # (seed, offset): Triton's Philox; offsets in int64, as the C++ prelude
    **{fn: (lambda a, c, f=f: f"{f}({a[0]}, {a[1]}.to(tl.int64))") for fn, f in _RANDOM.items()},
}


_IDENTITY = {"sum": "0", "prod": "1", "any": "0", "all": "1", "expsum": "0"}


def _identity(kind: str, t: torch.dtype) -> str:
    if kind in _IDENTITY:
        return _IDENTITY[kind] if not t.is_floating_point else _IDENTITY[kind] + ".0"
    low = kind in ("max", "argmax")
    if t.is_floating_point:
        return 'float("-inf")' if low else 'float("inf")'
    if t is torch.bool:
        return "0" if low else "1"
    info = torch.iinfo(t)
    return str(info.min if low else info.max)


class _Renderer:
    def __init__(self, kernel: k.Kernel):
        self.k = kernel
        self.lines: list[str] = []
        self.types: dict[str, torch.dtype] = {}
        self.scratch = {sc.name for sc in kernel.scratch}
        self.persistent = is_persistent(kernel)
        if kernel.scratch and not self.persistent:
            if is_symbolic(kernel.reduce_numel):  # no block fits every length of the row
                raise NeedsNumber(f"{kernel.name} keeps rows of length {kernel.reduce_numel} in registers")
            raise TritonUnsupported("row arrays need a persistent reduction")
        self.wide = _needs_int64(kernel)
        self.split = split_rows(kernel)
        self.only_stored = k.only_stored(kernel)
        self.flat = indexes_flat(kernel)
        # with split rows, a row stage is rendered twice: over the body's lanes, then over the
        # edge's, whose row-wise values are named with an _e suffix
        self.edge = False
        self.shift = 0  # extra indentation: the bodies of a one-tile variant's branches
        self.row_values: set[str] = set()
        if self.split is not None:
            row_statements = [s for st in kernel.stages if st.loop for s in st.body]
            self.row_values = {sc.name for sc in kernel.scratch} | {
                s.out for s in row_statements if not isinstance(s, (k.Reduce, k.Store, k.Flag))}
            self.scratch |= {name + "_e" for name in self.scratch}

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * (depth + self.shift) + text)

    def _lane_mask(self) -> str:
        """Which lanes of the row tile hold row elements (a split row's edge has its own)."""
        return "emask" if self.edge else "rmask"

    def _address(self, buf: str, index: Expr, ir_mask: str | None, in_loop: bool, store: bool):
        """Pointer and mask of a load or store. A load takes the shape its index needs (a
        per-row value stays [XBLOCK, 1] inside a row loop); a store, a computed index or an
        extra mask covers the whole tile of the context."""
        names = {sym.name for sym in index.symbols()}
        has_x = any(n.startswith("x") for n in names)
        has_r = any(n.startswith("r") for n in names)
        has_tmp = any(n.startswith("t") for n in names)
        body = self.split is not None and in_loop and not self.edge and index == self.split.index
        ptr = f"{buf} + ({'rbase + rindex' if body else render_index(index)})"  # a body: whole vectors
        rmask = self._lane_mask()
        if not self.k.reduce:
            full, tile_mask = "zero_x", "xmask"
        elif in_loop:
            full, tile_mask = "zero_edge" if self.edge else "zero_tile", f"xmask & {rmask}"
        else:
            full, tile_mask = "zero_row", "xmask"
        if store or has_tmp or ir_mask:
            mask = tile_mask + (f" & {ir_mask}" if ir_mask else "")
            return f"{ptr} + {full}", mask
        if has_x and (has_r or not in_loop or not self.k.reduce):
            return ptr, tile_mask
        if has_x:
            return ptr, "xmask"
        if has_r:
            return ptr, rmask
        # a one-element block, like constants: the interpreter mistypes a 0-d comparison
        # once it is broadcast
        return f"{ptr} + tl.zeros([1], tl.int32)", None

    def stmt(self, s: k.Stmt, depth: int, in_loop: bool) -> None:
        only_stored = isinstance(s, k.Compute) and s.out in self.only_stored
        if self.edge:
            s = self._edge_copy(s)
        if self.flat and getattr(s, "index", None) is not None:
            s = replace(s, index=flat_index(self.k, s.index))
        if isinstance(s, k.Load):
            self.types[s.out] = s.dtype
            if s.buf in self.scratch:
                self.emit(depth, f"{s.out} = {s.buf}")
                return
            ptr, mask = self._address(s.buf, s.index, s.mask, in_loop, store=False)
            load = f"tl.load({ptr}, mask={mask}, other=0)" if mask else f"tl.load({ptr})"
            if self.split is not None and in_loop and not self.edge:
                load = self._column_load(s) or load
            if s.dtype is torch.bfloat16:
                load = f"km.from_bf16({load})"
            elif s.dtype is torch.float16:
                load += ".to(tl.float32)"
            self.emit(depth, f"{s.out} = {load}")
        elif isinstance(s, k.Const):
            self.types[s.out] = s.dtype
            self.emit(depth, f"{s.out} = {literal(s.value, s.dtype)}")
        elif isinstance(s, k.IndexValue):
            self.types[s.out] = torch.int64
            idx = render_index(s.index)
            self.emit(depth, f"{s.out} = ({idx}) + tl.zeros([1], tl.int64)")
        elif isinstance(s, k.InBounds):
            self.types[s.out] = torch.bool
            idx = render_index(s.index)
            self.emit(depth, f"{s.out} = (0 <= ({idx})) & (({idx}) < {sz(s.size)})")
        elif isinstance(s, k.Compute):
            self.types[s.out] = s.dtype
            self.emit(depth, f"{s.out} = {render_compute(s, [self.types[a] for a in s.args], only_stored)}")
        elif isinstance(s, k.Store):
            if s.buf in self.scratch:
                self.emit(depth, f"{s.buf} = {s.value}")
                return
            ptr, mask = self._address(s.buf, s.index, None, in_loop, store=True)
            self.emit(depth, f"tl.store({ptr}, {self._stored(s)}, mask={mask})")
        elif isinstance(s, k.Reduce):
            self.reduce(s, depth)
        elif isinstance(s, k.Flag):
            # lanes that see an error store the same flag; any one offending value will do
            for slot, value in ((0, s.cond), (1, s.value)):
                index = ix.as_expr(SLOTS_PER_CHECK * s.site + slot)
                ptr, mask = self._address(ERROR_PARAM, index, s.cond, in_loop, store=True)
                self.emit(depth, f"tl.store({ptr}, {value}.to(tl.int64), mask={mask})")

    def _stored(self, s: k.Store) -> str:
        """The value converted to the buffer's storage type."""
        value, src = s.value, compute_dtype(self.types[s.value])
        if s.dtype in (torch.bfloat16, torch.float16) and src is not torch.float32:
            value = f"{value}.to(tl.float32)"
        if s.dtype is torch.bfloat16:
            return f"km.to_bf16({value})"
        if s.dtype in (torch.float16, torch.bool) or src != s.dtype:
            return f"{value}.to({TL_TYPE[s.dtype]})"
        return value

    # -------------------------------------------------------------- reductions
    def reduce(self, s: k.Reduce, depth: int) -> None:
        t = compute_dtype(s.dtype)
        self.types[s.out] = torch.int64 if s.kind in ("argmax", "argmin") else t
        ident = _identity(s.kind, t)
        masked = f"tl.where(xmask & {self._lane_mask()}, {s.value}, {ident})"
        if s.kind in ("argmax", "argmin"):
            self._arg_reduce(s, depth, t)
            return
        if s.kind == "expsum":
            self._expsum(s, depth)
            return
        if self.split is not None:  # the body's or the edge's part, combined by _combine_parts
            part = f"{s.out}_{'edge' if self.edge else 'body'}"
            self.emit(depth, f"{part} = {self._tile_reduce(s.kind, masked, t)}")
        elif self.persistent:
            self.emit(depth, f"{s.out} = {self._tile_reduce(s.kind, masked, t)}")
        else:
            acc = f"{s.out}_acc"
            combine = {"sum": f"{acc} + {masked}", "prod": f"{acc} * {masked}",
                       "max": f"tl.maximum({acc}, {masked})", "min": f"tl.minimum({acc}, {masked})",
                       "any": f"{acc} | {masked}", "all": f"{acc} & {masked}"}[s.kind]
            if s.kind in ("max", "min") and t.is_floating_point:
                combine = combine[:-1] + ", propagate_nan=tl.PropagateNan.ALL)"
            self.emit(depth, f"{acc} = {combine}")

    def _expsum(self, s: k.Reduce, depth: int) -> None:
        """sum(exp(x - max x)) over the row. A whole row in one tile: its maximum, then the
        sum. A loop over chunks: the running maximum raised to the chunk's and the sum so far
        rescaled to it (m' = max(m, max chunk); s = s * exp(m - m') + sum exp(x - m')), so
        the row is read once. A shift of -inf (no finite value yet) is taken as 0, so that
        exp(-inf - -inf) never enters the sum."""
        lanes = f"xmask & {self._lane_mask()}"
        if self.split is not None:  # the body's or the edge's part, combined by _combine_parts
            part = f"{s.out}_{'edge' if self.edge else 'body'}"
            values = f"tl.where({lanes}, {s.value}, float('-inf'))"
            self.emit(depth, f"{part}_max = tl.max(tl.max({values}, 1), 0)")
            self.emit(depth, f"{part}_shift = tl.where({part}_max == float('-inf'), 0.0, {part}_max)")
            terms = f"tl.where({lanes}, tl.exp({s.value} - {part}_shift), 0.0)"
            self.emit(depth, f"{part} = tl.max(tl.sum({terms}, 1), 0)")
            return
        chunk_max = f"tl.max(tl.where({lanes}, {s.value}, float('-inf')), 1)[:, None]"
        new = f"{s.out}_next" if not self.persistent else f"{s.out}_max"
        self.emit(depth, f"{new} = {chunk_max}" if self.persistent
                  else f"{new} = tl.maximum({s.out}_max, {chunk_max})")
        self.emit(depth, f"{s.out}_shift = tl.where({new} == float('-inf'), 0.0, {new})")
        terms = f"tl.sum(tl.where({lanes}, tl.exp({s.value} - {s.out}_shift), 0.0), 1)[:, None]"
        if self.persistent:
            self.emit(depth, f"{s.out} = {terms}")
            self._expsum_finish(s, depth, s.out)
            return
        self.emit(depth, f"{s.out}_acc = {s.out}_acc * tl.exp({s.out}_max - {s.out}_shift) + {terms}")
        self.emit(depth, f"{s.out}_max = {new}")

    def _expsum_finish(self, s: k.Reduce, depth: int, acc: str) -> None:
        """A row of -inf: each exp(x - max x) is exp(NaN), as in eager."""
        self.emit(depth, f"{s.out} = tl.where({s.out}_max == float('-inf'), float('nan'), {acc})")

    def _tile_reduce(self, kind: str, tile: str, t: torch.dtype) -> str:
        """The tile reduced along its rows: [XBLOCK, 1], or with split rows (one row per
        program) a scalar, which no tile's layout has to be converted to."""
        if kind == "prod":
            rows = f"km.prod({tile})"
        elif kind in ("any", "all"):
            rows = f"tl.{'max' if kind == 'any' else 'min'}({tile}.to(tl.int32), 1)"
        elif kind in ("max", "min") and t.is_floating_point:  # NaN wins, as in eager
            rows = f"km.{kind}_nan({tile})"
        else:
            rows = f"tl.{kind}({tile}, 1)"
        # the one row's value: a reduction over one element returns that element
        value = f"tl.max({rows}, 0)" if self.split is not None else f"{rows}[:, None]"
        return f"({value} > 0)" if kind in ("any", "all") else value

    def _combine_parts(self, s: k.Reduce) -> None:
        """A split row's reduction: its body's part combined with its edge's (an online sum's
        parts each rescaled to the larger of their maxima)."""
        a, b = f"{s.out}_body", f"{s.out}_edge"
        if s.kind == "expsum":
            self.emit(1, f"{s.out}_max = tl.maximum({a}_max, {b}_max)")
            self.emit(1, f"{s.out}_shift = tl.where({s.out}_max == float('-inf'), 0.0, {s.out}_max)")
            rescaled = f"{a} * tl.exp({a}_max - {s.out}_shift) + {b} * tl.exp({b}_max - {s.out}_shift)"
            self._expsum_finish(s, 1, rescaled)
            return
        fp = compute_dtype(s.dtype).is_floating_point
        combined = {"sum": f"{a} + {b}", "prod": f"{a} * {b}", "any": f"{a} | {b}", "all": f"{a} & {b}",
                    "max": f"km.maximum_nan({a}, {b})" if fp else f"tl.maximum({a}, {b})",
                    "min": f"km.minimum_nan({a}, {b})" if fp else f"tl.minimum({a}, {b})"}[s.kind]
        self.emit(1, f"{s.out} = {combined}")

    def _arg_reduce(self, s: k.Reduce, depth: int, t: torch.dtype) -> None:
        """The first position of the extreme value, NaN counting as extreme (as in eager).
        A row loop combines (value, position) per lane and reduces the lanes after it."""
        key = f"tl.where(xmask & rmask, {s.value}, {_identity(s.kind, t)})"
        pos = f"({render_index(s.index)}) + tl.zeros([XBLOCK, RBLOCK], tl.int64)"
        if self.persistent:
            self.emit(depth, f"{s.out} = km.{s.kind}({key}, {pos})[:, None]")
        else:
            self.emit(depth, f"{s.out}_best, {s.out}_idx = km.{s.kind}_combine("
                             f"{s.out}_best, {s.out}_idx, {key}, {pos})")

    def _loop_init(self, reductions: list[k.Reduce], depth: int) -> None:
        for r in reductions:
            t = compute_dtype(r.dtype)
            ident = _identity(r.kind, t)
            if r.kind in ("argmax", "argmin"):
                self.emit(depth, f"{r.out}_best = tl.full([XBLOCK, RBLOCK], {ident}, {tl_type(t)})")
                self.emit(depth, f"{r.out}_idx = tl.zeros([XBLOCK, RBLOCK], tl.int64)")
            elif r.kind == "expsum":  # per row: the running maximum and the sum rescaled to it
                self.emit(depth, f"{r.out}_acc = tl.zeros([XBLOCK, 1], {tl_type(t)})")
                self.emit(depth, f"{r.out}_max = tl.full([XBLOCK, 1], float('-inf'), {tl_type(t)})")
            else:
                self.emit(depth, f"{r.out}_acc = tl.full([XBLOCK, RBLOCK], {ident}, {tl_type(t)})")

    def _loop_finish(self, reductions: list[k.Reduce], depth: int) -> None:
        for r in reductions:
            t = compute_dtype(r.dtype)
            if r.kind in ("argmax", "argmin"):
                self.emit(depth, f"{r.out} = km.{r.kind}({r.out}_best, {r.out}_idx)[:, None]")
            elif r.kind == "expsum":
                self._expsum_finish(r, depth, f"{r.out}_acc")
            else:
                self.emit(depth, f"{r.out} = {self._tile_reduce(r.kind, r.out + '_acc', t)}")

    def _empty_row_stage(self, stage: k.Stage) -> None:
        """Rows of no elements: each reduction is its identity (no load may run: an empty
        tensor may have no memory at all)."""
        for s in stage.body:
            if isinstance(s, k.Reduce):
                t = compute_dtype(s.dtype)
                arg = s.kind in ("argmax", "argmin")
                self.types[s.out] = torch.int64 if arg else t
                value = "0" if arg else _identity(s.kind, t)
                self.emit(1, f"{s.out} = tl.full([XBLOCK, 1], {value}, {'tl.int64' if arg else tl_type(t)})")

    # -------------------------------------------------------------- split rows
    def _split_prologue(self) -> None:
        """A row's two tiles: its aligned body of whole vectors (lanes rindex < rbody, the
        body of a streamed buffer at rbase + rindex), and the up to V - 1 elements before the
        body and after it (lanes eindex < the edge's size). r0 is a body lane's column, r0_e
        an edge lane's."""
        split, size = self.split, self.k.reduce_numel
        v, r = split.vector, self.k.reduce[0]
        start = ix.substitute(split.index, {r: ix.as_expr(0)})
        self.emit(1, "rindex = tl.arange(0, RBLOCK)[None, :]")
        self.emit(1, f"rstart = {render_index(start)}")
        self.emit(1, f"rhead = ({v} - rstart % {v}) % {v}")
        self.emit(1, f"rbody = ({size} - rhead) // {v} * {v}")
        self.emit(1, f"rbase = tl.multiple_of(rstart + rhead, {v})")
        self.emit(1, "rmask = rindex < rbody")
        self.emit(1, f"{r.name} = rhead + rindex")
        self.emit(1, f"eindex = tl.arange(0, {SPLIT_EDGE})[None, :]")
        self.emit(1, f"emask = eindex < {size} - rbody")
        self.emit(1, f"{r.name}_e = tl.where(eindex < rhead, eindex, rbody + eindex)")  # head, then tail
        self.emit(1, f"zero_edge = tl.zeros([XBLOCK, {SPLIT_EDGE}], tl.int32)")

    def _column_load(self, s: k.Load) -> str | None:
        """A split row body's load of a contiguous weight (w[r0 + c]) of 16- or 32-bit elements,
        wherever the body starts (km.load_columns); None for any other load (other weights load
        element by element in the body's layout)."""
        r = self.k.reduce[0]
        contiguous = s.mask is None and s.index.terms == ((r, 1),) and s.index.const >= 0
        if not contiguous or s.dtype.itemsize not in (2, 4):
            return None
        c = s.index.const
        return (f"km.load_columns({s.buf}, rhead + {c}, {self.k.reduce_numel + c}, ALIGNED, "
                f"{16 // s.dtype.itemsize}, RBLOCK)")

    def _edge_copy(self, s: k.Stmt) -> k.Stmt:
        """A row statement over the edge's lanes: its row-wise values renamed, r0 -> r0_e."""
        def name(v):
            return v + "_e" if v in self.row_values else v

        r = self.k.reduce[0]
        fields = {}
        if hasattr(s, "out") and not isinstance(s, k.Reduce):
            fields["out"] = name(s.out)
        if hasattr(s, "index") and s.index is not None:
            # values in an index (a gathered position) are the edge's too
            renamed = {v: ix.sym(name(v.name), v.extent) for v in s.index.symbols()
                       if v.name in self.row_values}
            fields["index"] = ix.substitute(s.index, {r: ix.sym(r.name + "_e", r.extent), **renamed})
        for field in ("buf", "value", "mask", "cond"):
            if getattr(s, field, None) is not None:
                fields[field] = name(getattr(s, field))
        if isinstance(s, k.Compute):
            fields["args"] = tuple(name(a) for a in s.args)
        return replace(s, **fields)

    # -------------------------------------------------------------- kernel
    def _flat_kernel(self, pid: str) -> None:
        """An element-wise kernel over its flat index. A mask that can change inside a 16-byte
        vector makes Triton load and store one element at a time, so when the size leaves a
        partial last tile, every program but the last runs with a mask that is true throughout."""
        full = f"xindex < {sz(self.k.outer_numel)}"
        if known_divides(MASK_GRAIN, self.k.outer_numel):
            self._flat_body(1, full)
            return
        self.emit(1, f"if {pid} < {sz(self.k.outer_numel)} // XBLOCK:")
        self._flat_body(2, "tl.full([XBLOCK], 1, tl.int1)")
        self.emit(1, "else:")
        self._flat_body(2, full)

    def _flat_body(self, depth: int, mask: str) -> None:
        """An element-wise kernel's body over its flat index."""
        self.emit(depth, f"xmask = {mask}")
        self.emit(depth, "zero_x = tl.zeros([XBLOCK], tl.int32)")
        self._decompose(depth, "xindex", self.k.outer)
        for stage in self.k.stages:
            for s in stage.body:
                self.stmt(s, depth, stage.loop)

    def _decompose(self, depth: int, flat: str, syms) -> None:
        stride = 1
        for sym in reversed(syms):
            expr = flat if stride == 1 else f"({flat} // {sz(stride)})"
            if sym is not syms[0]:
                expr = f"({expr} % {sz(sym.extent)})"
            self.emit(depth, f"{sym.name} = {expr}")
            stride *= sym.extent

    def _program_id(self, axis: int) -> str:
        if is_family(self.k):  # int64 where a launch's sizes need it (triton_sizes.wide_function)
            return f"tl.program_id({axis}).to(tl.int64 if WIDE else tl.int32)"
        return f"tl.program_id({axis}).to(tl.int64)" if self.wide else f"tl.program_id({axis})"

    def render(self) -> str:
        kern = self.k
        params = ", ".join([p.name for p in kern.params] + size_names(kern))
        self.emit(0, "@triton.jit")
        # ALIGNED: compiled for tensors that all start on 16-byte boundaries (the direct launch);
        # Triton's JIT, which launches any others, and the interpreter get False
        constexprs = "XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, ALIGNED: tl.constexpr"
        one_tile = one_tile_variant(kern)
        if one_tile:
            constexprs += ", ONE_TILE: tl.constexpr"
        if is_family(kern):
            constexprs += ", WIDE: tl.constexpr"
        self.emit(0, f"def {kern.name}({params}, {constexprs}):")
        pid = self._program_id(0)
        if self.split is not None:  # one row per program: its index and values are scalars
            self.emit(1, f"xindex = {pid}")
        elif kern.reduce:
            self.emit(1, f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        else:
            self.emit(1, f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
        if not kern.reduce and not row_tiled(kern):
            self._flat_kernel(pid)
            return "\n".join(self.lines)
        if kern.reduce:
            self.emit(1, f"xmask = xindex < {sz(kern.outer_numel)}")
            self.emit(1, "zero_row = tl.zeros([XBLOCK, 1], tl.int32)")
            self.emit(1, "zero_tile = tl.zeros([XBLOCK, RBLOCK], tl.int32)")
            self._decompose(1, "xindex", kern.outer)
        else:
            # row tiled: a program covers XBLOCK points of one line, whose indices are computed
            # once per program, not divided out of every point's flat index
            *lines, inner = kern.outer
            self.emit(1, f"xmask = xindex < {sz(inner.extent)}")
            self.emit(1, "zero_x = tl.zeros([XBLOCK], tl.int32)")
            self.emit(1, f"line = {self._program_id(1)}")
            self._decompose(1, "line", lines)
            for sym in lines:
                self.emit(1, f"{sym.name} = {sym.name} + zero_x")
            self.emit(1, f"{inner.name} = xindex")
        if one_tile:  # rows that fit one tile reduce it as a persistent kernel; others loop
            self.emit(1, "if ONE_TILE:")
            self.shift, self.persistent = 1, True
            self._stages()
            self.shift, self.persistent = 0, False
            self.emit(1, "else:")
            self.shift = 1
            self._stages()
            self.shift = 0
        else:
            self._stages()
        return "\n".join(self.lines)

    def _stages(self) -> None:
        kern = self.k
        if self.split is not None:
            self._split_prologue()
        elif self.persistent:
            self.emit(1, "rindex = tl.arange(0, RBLOCK)[None, :]")
            self.emit(1, f"rmask = rindex < {sz(kern.reduce_numel)}")
            self._decompose(1, "rindex", kern.reduce)
            if self.split is None and kern.reduce_numel != 0:
                for s, loop in merge_across_stages(kern.stages, self.only_stored):
                    self.stmt(s, 1, loop)
                return
        for stage in kern.stages:
            if stage.loop and kern.reduce and kern.reduce_numel == 0:
                self._empty_row_stage(stage)
            elif stage.loop and self.split is not None:
                for self.edge in (False, True):
                    for s in stage.body:
                        self.stmt(s, 1, True)
                self.edge = False
                for s in stage.body:
                    if isinstance(s, k.Reduce):
                        self._combine_parts(s)
            elif stage.loop and kern.reduce and not self.persistent:
                reductions = [s for s in stage.body if isinstance(s, k.Reduce)]
                self._loop_init(reductions, 1)
                self.emit(1, f"for roffset in range(0, {sz(kern.reduce_numel)}, RBLOCK):")
                self.emit(2, "rindex = roffset + tl.arange(0, RBLOCK)[None, :]")
                self.emit(2, f"rmask = rindex < {sz(kern.reduce_numel)}")
                self._decompose(2, "rindex", kern.reduce)
                for s in stage.body:
                    self.stmt(s, 2, True)
                self._loop_finish(reductions, 1)
            else:
                for s in stage.body:
                    self.stmt(s, 1, stage.loop)


def indexes_flat(kernel: k.Kernel) -> bool:
    """Whether a kernel's xindex is its flat outer index (see flat_index): not where a program
    covers part of one line (row_tiled), nor for split rows, which match their index's text."""
    return not row_tiled(kernel) and split_rows(kernel) is None


def flat_index(kernel: k.Kernel, index: Expr) -> Expr:
    """An index whose outer part walks the outer domain in row-major order, m * (x0 * n1 + x1),
    as m * xindex: no division recovers the coordinates it would only recombine (a family's
    extents would make them divisions by run-time values)."""
    outer = kernel.outer
    nested = any(not isinstance(a, Sym) and a.arg.symbols() & set(outer) for a, _ in index.terms)
    if len(outer) < 2 or nested:
        return index
    stride = index.coef(outer[-1])
    if stride == 0:
        return index
    multiple = stride
    for x in reversed(outer):
        if not known_eq(index.coef(x), stride):
            return index
        stride = stride * x.extent
    rest = ix.Expr(tuple((a, c) for a, c in index.terms if a not in outer), index.const)
    return rest + ix.sym("xindex") * multiple


def _needs_int64(kernel: k.Kernel) -> bool:
    """Whether a kernel of fixed sizes indexes in int64 (a family's decides per launch)."""
    if is_family(kernel):
        return False
    limit = 2**31 - 1
    if kernel.outer_numel * max(kernel.reduce_numel, 1) >= limit:
        return True
    for st in kernel.stages:
        for s in st.body:
            if isinstance(s, (k.Load, k.Store)):
                b = s.index.bounds()
                if b is None or b[1] >= limit or b[0] <= -limit:
                    return True
    return False


HEADER = """import triton
import triton.language as tl
from kiln.codegen import triton_math as km
"""


def render_kernel(kernel: k.Kernel) -> str:
    return _Renderer(kernel).render()


def render_source(kernel: k.Kernel) -> str:
    return HEADER + "\n\n" + render_kernel(kernel) + "\n"

"""Math functions for generated Triton kernels.

On a GPU they are CUDA's libdevice. Triton's CPU interpreter cannot call libdevice, so there
each function is composed from the primitives it does support (accurate to a few float32
ulps in absolute terms: enough to check generated kernels, not to replace libdevice).
INTERPRETER_UNSUPPORTED lists the functions with no composition: kiln keeps those in ATen
when it generates Triton for the interpreter.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
INTERPRETER_UNSUPPORTED = frozenset({"asin", "acos", "atan", "atan2"})


# float32 erf without a branch, for the GPU and the interpreter alike: x * S(x^2) below 1,
# 1 - 2^(-t p(t)) from there (t = |x| clamped at 4, where erf rounds to 1). Both sides are
# computed and one is selected, which on a GPU still costs less than libdevice's erff
# and its branches. The coefficients are minimax fits (relative error for S,
# absolute for p); the result is within 2.5 float32 ulps of erf (test_triton_math.py).
# The polynomials are written as tl.fma: one fused instruction per step on the GPU, where
# kernels otherwise compile without fp fusion (runtime/triton_build.py).
@triton.jit
def erf_f32(x):
    t = tl.abs(x)
    u = x * x
    s = tl.fma(-0.000563156558200717, u, 0.004917584825307131)
    s = tl.fma(s, u, -0.026711339130997658)
    s = tl.fma(s, u, 0.11280181258916855)
    s = tl.fma(s, u, -0.37612324953079224)
    s = tl.fma(s, u, 1.1283791065216064)
    c = tl.minimum(t, 4.0)
    p = tl.fma(2.039262471953407e-05, c, -0.0005083264550194144)
    p = tl.fma(p, c, 0.005431334488093853)
    p = tl.fma(p, c, -0.03466165438294411)
    p = tl.fma(p, c, 0.15371806919574738)
    p = tl.fma(p, c, 0.9160510301589966)
    p = tl.fma(p, c, 1.6283658742904663)
    tail = 1.0 - tl.exp2(-(c * p))
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    signed_tail = (tail.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(t >= 1.0, signed_tail, x * s)  # NaN fails t >= 1: x * s is NaN


# float32 GELU (erf form) as x * Phi(x), Phi(x) = 1 / (1 + 2^(x h(x^2))): one exp2 and one
# reciprocal instead of erf's two polynomials. h is a degree-6 fit of log2((1 - Phi) / Phi) / x
# for |x| <= 5.5 that minimizes Phi's largest error (Lawson's reweighted least squares): Phi is
# within 2.9e-8 of the normal CDF in exact arithmetic, 9.2e-8 through float32 operations in the
# interpreter (test_triton_math.py; eager's 1 + erf carries about 6e-8), and on the H200 GELU
# is within twice eager's error (tests/gpu). h is negative for every u >= 0 (it has no real
# root), so past 5.5, where eager's 1 + erf has rounded to 0 or 2, x h(x^2) still drives Phi
# to 0 or 1 without a clamp on u (an infinite u makes h -inf, a NaN x stays NaN). This form
# takes fewer instructions than x * (1 + erf(x / sqrt 2)) / 2 through erf_f32.
@triton.jit
def _gelu_exponent(x):
    u = x * x
    h = tl.fma(-5.067239123461641e-09, u, 3.8163137792006125e-07)
    h = tl.fma(h, u, -1.1439834797311956e-05)
    h = tl.fma(h, u, 0.00015957994568858893)
    h = tl.fma(h, u, 9.404921292695318e-05)
    h = tl.fma(h, u, -0.10483512186485054)
    h = tl.fma(h, u, -2.302209296490786)
    return tl.exp2(x * h)


if not INTERPRETED:
    from triton.language.extra import libdevice

    @triton.jit
    def tanh(x):
        return libdevice.tanh(x)

    @triton.jit
    def log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def expm1(x):
        return libdevice.expm1(x)

    @triton.jit
    def erfc(x):
        return libdevice.erfc(x)

    @triton.jit
    def pow(x, y):
        return libdevice.pow(x, y)

    @triton.jit
    def tan(x):
        return libdevice.tan(x)

    @triton.jit
    def sinh(x):
        return libdevice.sinh(x)

    @triton.jit
    def cosh(x):
        return libdevice.cosh(x)

    @triton.jit
    def asinh(x):
        return libdevice.asinh(x)

    @triton.jit
    def acosh(x):
        return libdevice.acosh(x)

    @triton.jit
    def atanh(x):
        return libdevice.atanh(x)

    @triton.jit
    def asin(x):
        return libdevice.asin(x)

    @triton.jit
    def acos(x):
        return libdevice.acos(x)

    @triton.jit
    def atan(x):
        return libdevice.atan(x)

    @triton.jit
    def atan2(x, y):
        return libdevice.atan2(x, y)

    @triton.jit
    def log10(x):
        return libdevice.log10(x)

    @triton.jit
    def nearbyint(x):
        return libdevice.nearbyint(x)

    @triton.jit
    def trunc(x):
        return libdevice.trunc(x)

    @triton.jit
    def copysign(x, y):
        return libdevice.copysign(x, y)

    # one MUFU.RCP: Triton's division adds range checks, and 1 + 2^(...) is never subnormal
    @triton.jit
    def gelu(x):
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + _gelu_exponent(x)],
                                      dtype=tl.float32, is_pure=True, pack=1)
        return x * r

    # x rounded to bf16 (to nearest even), as a float32, in one instruction: cvt.rn.bf16x2.f32
    # packs bf16(x) into the upper half of a register and bf16(0) = 0 into the lower, which
    # are x's rounded bits (a conversion to bf16 and back takes two instructions)
    @triton.jit
    def round_bf16(x):
        return tl.inline_asm_elementwise("{ .reg .b32 z; mov.b32 z, 0; cvt.rn.bf16x2.f32 $0, $1, z; }",
                                         "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)

    @triton.jit
    def to_bf16(x):
        return x.to(tl.bfloat16)

    # a shift or a mask: Triton's own conversion takes two instructions for the upper half
    # of a register
    @triton.jit
    def from_bf16(x):
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)

else:
    # The interpreter truncates float32 -> bf16 and mangles bf16 subnormals, so bf16 is
    # converted here through its bits: the upper half of a float32, rounded to nearest even.
    @triton.jit
    def _bf16_bits(x):
        u = x.to(tl.uint32, bitcast=True)
        u = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000
        return tl.where(x != x, 0x7FC00000, u)

    @triton.jit
    def round_bf16(x):
        return _bf16_bits(x).to(tl.float32, bitcast=True)

    @triton.jit
    def to_bf16(x):
        return (_bf16_bits(x) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)

    @triton.jit
    def from_bf16(x):
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)

    @triton.jit
    def gelu(x):
        return x / (1.0 + _gelu_exponent(x))

    @triton.jit
    def tanh(x):
        t = tl.exp(-2.0 * tl.abs(x))
        r = (1.0 - t) / (1.0 + t)
        return tl.where(x < 0, -r, r)

    @triton.jit
    def log1p(x):
        return tl.log(1.0 + x)

    @triton.jit
    def expm1(x):
        return tl.exp(x) - 1.0

    @triton.jit
    def erfc(x):
        return 1.0 - tl.erf(x)

    @triton.jit
    def trunc(x):
        return tl.where(x < 0, tl.ceil(x), tl.floor(x))

    @triton.jit
    def pow(x, y):
        r = tl.exp2(y * tl.log2(tl.abs(x)))
        whole = tl.floor(y) == y
        odd = whole & ((y - 2.0 * tl.floor(y * 0.5)) == 1.0)
        r = tl.where((x < 0) & odd, -r, r)
        r = tl.where((x < 0) & (~whole), float("nan"), r)
        return tl.where(y == 0, 1.0, r)

    @triton.jit
    def tan(x):
        return tl.sin(x) / tl.cos(x)

    @triton.jit
    def sinh(x):
        return 0.5 * (tl.exp(x) - tl.exp(-x))

    @triton.jit
    def cosh(x):
        return 0.5 * (tl.exp(x) + tl.exp(-x))

    @triton.jit
    def asinh(x):
        a = tl.abs(x)
        r = tl.log(a + tl.sqrt(a * a + 1.0))
        return tl.where(x < 0, -r, r)

    @triton.jit
    def acosh(x):
        return tl.log(x + tl.sqrt(x * x - 1.0))

    @triton.jit
    def atanh(x):
        return 0.5 * tl.log((1.0 + x) / (1.0 - x))

    @triton.jit
    def log10(x):
        return tl.log(x) * 0.4342944819032518

    @triton.jit
    def nearbyint(x):
        r = tl.floor(x + 0.5)
        tie = (r - x) == 0.5
        odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
        r = tl.where(tie & odd, r - 1.0, r)
        return tl.where(r == 0, x * 0.0, r)  # a zero keeps x's sign: round(-0.3) is -0.0

    @triton.jit
    def copysign(x, y):
        neg = (y < 0) | ((y == 0) & ((1.0 / y) < 0))
        return tl.where(neg, tl.abs(x) * -1.0, tl.abs(x))  # unary minus is 0 - x: -(+0.0) is +0.0


# Integer division as eager computes it. Divisors 0 and -1 never reach a division: by 0 it is
# undefined (the host raises; the kernel's result is 0), and the smallest integer by -1
# overflows, where eager returns the smallest integer again (its negation, wrapped).
@triton.jit
def _minus_one(b):
    return (b < 0) & (b == -1)  # an unsigned 255 is no -1


@triton.jit
def _divisor(b):
    return tl.where((b == 0) | _minus_one(b), 1, b)


@triton.jit
def truncdiv_int(a, b):
    q = tl.where(_minus_one(b), -a, a // _divisor(b))
    return tl.where(b == 0, 0, q)


# Python's floor division and remainder (the sign follows the divisor), as eager computes them.
@triton.jit
def floordiv_int(a, b):
    d = _divisor(b)
    q = a // d
    fix = ((a % d) != 0) & ((a < 0) != (d < 0))
    q = tl.where(_minus_one(b), -a, q - fix.to(q.dtype))
    return tl.where(b == 0, 0, q)


@triton.jit
def fmod_int(a, b):
    return a % _divisor(b)  # 0 where b is 0 or -1


# max/min combines for float reductions: NaN propagates, as in eager
@triton.jit
def maximum_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def minimum_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


# (value, index) combines for argmax/argmin: the first extreme value wins, NaN counting as
# the most extreme (as eager). For integers `v != v` is false and folds away.
@triton.jit
def argmax_combine(v1, i1, v2, i2):
    nan1 = v1 != v1
    nan2 = v2 != v2
    tie = (v1 == v2) | (nan1 & nan2)
    first = (v1 > v2) | (nan1 & ~nan2) | (tie & (i1 < i2))
    return tl.where(first, v1, v2), tl.where(first, i1, i2)


@triton.jit
def argmin_combine(v1, i1, v2, i2):
    nan1 = v1 != v1
    nan2 = v2 != v2
    tie = (v1 == v2) | (nan1 & nan2)
    first = (v1 < v2) | (nan1 & ~nan2) | (tie & (i1 < i2))
    return tl.where(first, v1, v2), tl.where(first, i1, i2)


@triton.jit
def pow_int(a, b):
    """Integer power by squaring, wrapping as eager does; a negative exponent gives 1, -1 or 0."""
    base = a + b * 0  # both operands at the broadcast shape
    e = b + a * 0
    r = base * 0 + 1
    neg = e < 0
    e = tl.where(neg, 0, e)
    while tl.max(e) > 0:
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    odd = (b & 1) != 0
    r_neg = tl.where(a == 1, 1, tl.where(a == -1, tl.where(odd, -1, 1), 0))
    return tl.where(neg, r_neg.to(r.dtype), r)


@triton.jit
def remainder_int(a, b):
    d = _divisor(b)
    r = a % d  # 0 where b is 0 or -1
    return r + tl.where((r != 0) & ((r < 0) != (d < 0)), d, 0)


@triton.jit
def remainder_fp(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)  # r + 0.0 would make -0.0 +0.0


@triton.jit
def floordiv_fp(a, b):
    mod = a % b
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    quotient = a / b
    fl = tl.where(div == 0, copysign(tl.zeros_like(div), quotient), fl)
    return tl.where(b == 0, quotient, fl)


# ------------------------------------------------------------------ row reductions
# A tile [X, R] reduced along its rows (axis 1) to [X]. On the GPU each is one tl.reduce.
# The interpreter runs a custom combine element by element in Python (seconds for one
# tile), so there they are composed of its vectorized reductions.
if not INTERPRETED:

    @triton.jit
    def max_nan(x):
        return tl.reduce(x, 1, maximum_nan)

    @triton.jit
    def min_nan(x):
        return tl.reduce(x, 1, minimum_nan)

    @triton.jit
    def argmax(v, i):
        _, at = tl.reduce((v, i), 1, argmax_combine)
        return at

    @triton.jit
    def argmin(v, i):
        _, at = tl.reduce((v, i), 1, argmin_combine)
        return at

    @triton.jit
    def _mul(a, b):
        return a * b

    @triton.jit
    def prod(x):
        return tl.reduce(x, 1, _mul)

else:

    @triton.jit
    def _any_nan(x):
        return tl.max((x != x).to(tl.int32), 1) > 0

    @triton.jit
    def max_nan(x):
        return tl.where(_any_nan(x), float("nan"), tl.max(x, 1))

    @triton.jit
    def min_nan(x):
        return tl.where(_any_nan(x), float("nan"), tl.min(x, 1))

    @triton.jit
    def _first_at(v, i, best):
        """The first position of NaN, else of best (the interpreter's max ignores NaN)."""
        nan_at = tl.min(tl.where(v != v, i, 9223372036854775807), 1)
        at = tl.min(tl.where(v == best[:, None], i, 9223372036854775807), 1)
        return tl.where(nan_at < 9223372036854775807, nan_at, at)

    @triton.jit
    def argmax(v, i):
        return _first_at(v, i, tl.max(v, 1))

    @triton.jit
    def argmin(v, i):
        return _first_at(v, i, tl.min(v, 1))

    @triton.jit
    def prod(x):
        # pairwise halving: the row length is a power of two
        while x.shape[1] > 1:
            a, b = tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
            x = a * b
        return tl.reshape(x, [x.shape[0]])


# A split row's weights (see codegen/triton_launch.split_rows): ptr[start + j] for the body's columns
# j as a [1, RBLOCK] tile. The body is whole 16-byte vectors of the row, so where start is off
# a 16-byte boundary, a load in the body's layout is element by element and a warp's load
# touches four 128-byte lines. Instead each thread loads the two aligned vectors around its
# columns and shifts them into place in registers: byte permutes (prmt) of 8, 4 and 2 bytes
# as the shift's bits select. Vectors wholly past `stop` are not loaded; the last one loaded
# may run past it, within its 16-byte block. The permutes take a thread's 8 (16-bit)
# or 4 (32-bit) consecutive columns at once, which only vector loads guarantee (ALIGNED: the
# tensors are 16-byte aligned, as compiled); otherwise, and in the interpreter, the load is
# plain. Shifting in registers is faster than converting a flat range's layout through shared
# memory, and close to an aligned load.
def _shift_asm(elem_bits: int) -> str:
    """PTX: four words from the eight of two vectors ($4-$11) in three (16-bit elements) or
    two (32-bit) permutes of word pairs 2, 1 and 1 words apart, each by its selector operand:
    shifts of 8, 4 and 2 bytes, or none."""
    pack = 128 // elem_bits  # elements in a vector: operands per 32-bit selector
    reaches = [2, 1, 1] if elem_bits == 16 else [2, 1]
    counts = [4]  # words each step makes: what the next needs, plus its reach
    for reach in reversed(reaches[1:]):
        counts.insert(0, counts[0] + reach)
    words, lines = [f"${i}" for i in range(4, 12)], []
    for step, (reach, count) in enumerate(zip(reaches, counts)):
        last = step == len(reaches) - 1
        out = [f"${i}" for i in range(4)] if last else [f"s{step}_{i}" for i in range(count)]
        if not last:
            lines.append(f".reg .b32 {', '.join(out)};")
        selector = f"${12 + pack * step}"
        lines += [f"prmt.b32 {o}, {words[i]}, {words[i + reach]}, {selector};" for i, o in enumerate(out)]
        words = out
    return "{\n" + "\n".join(lines) + "\n}"


# prmt selectors: the first operand's bytes, the second's, or the upper half of the first
# and the lower half of the second
_FIRST, _SECOND, _HALF = tl.constexpr(0x3210), tl.constexpr(0x7654), tl.constexpr(0x5432)
_SHIFT16 = tl.constexpr(_shift_asm(16))
_SHIFT32 = tl.constexpr(_shift_asm(32))


@triton.jit
def _plain_columns(ptr, start, stop, RBLOCK: tl.constexpr):
    columns = start + tl.arange(0, RBLOCK)[None, :]
    return tl.load(ptr + columns, mask=columns < stop, other=0)


if not INTERPRETED:

    @triton.jit
    def load_columns(ptr, start, stop, ALIGNED: tl.constexpr, VECTOR: tl.constexpr, RBLOCK: tl.constexpr):
        if ALIGNED:
            rindex = tl.arange(0, RBLOCK)[None, :]
            base = tl.multiple_of(start // VECTOR * VECTOR, VECTOR)
            end = (stop + VECTOR - 1) // VECTOR * VECTOR
            lo = tl.load(ptr + base + rindex, mask=base + rindex < end, other=0)
            hi = tl.load(ptr + base + VECTOR + rindex, mask=base + VECTOR + rindex < end, other=0)
            shift = start % VECTOR * (16 // VECTOR)  # bytes
            zero = tl.zeros([1, RBLOCK], tl.int32)
            by8 = zero + tl.where((shift & 8) != 0, _SECOND, _FIRST)
            by4 = zero + tl.where((shift & 4) != 0, _SECOND, _FIRST)
            if VECTOR == 8:
                by2 = zero + tl.where((shift & 2) != 0, _HALF, _FIRST)
                return tl.inline_asm_elementwise(_SHIFT16, "=r,=r,=r,=r" + ",r" * 32, [lo, hi, by8, by4, by2],
                                                 dtype=lo.dtype, is_pure=True, pack=8)
            else:
                return tl.inline_asm_elementwise(_SHIFT32, "=r,=r,=r,=r" + ",r" * 16, [lo, hi, by8, by4],
                                                 dtype=lo.dtype, is_pure=True, pack=4)
        else:
            return _plain_columns(ptr, start, stop, RBLOCK)

else:

    @triton.jit
    def load_columns(ptr, start, stop, ALIGNED: tl.constexpr, VECTOR: tl.constexpr, RBLOCK: tl.constexpr):
        return _plain_columns(ptr, start, stop, RBLOCK)


# A matmul operand as tl.dot takes it (codegen/templates/matmul.py): as loaded on the GPU
# (wgmma reads 16-bit operands); as float32 in the interpreter, whose bf16 values are raw bits
# and whose fp16 product would accumulate in fp16.
if not INTERPRETED:

    @triton.jit
    def dot_operand(x):
        return x

else:

    @triton.jit
    def dot_operand(x):
        if x.dtype == tl.bfloat16:
            return from_bf16(x)
        else:
            return x.to(tl.float32)

"""Op families of the fuzz grammar. Each family draws one statement (a Draw) over the values
of a Context, or None when nothing fits; eager then accepts or rejects it (grammar.py).
FAMILIES, at the end, weighs them."""

from __future__ import annotations

import torch

from kiln.tools.fuzz.grammar import Context, Draw

F = "torch.nn.functional"

# (format, preserves exactness, needs exact arguments)
UNARY = [
    ("torch.neg({0})", True, False),
    ("torch.abs({0})", True, False),
    ("torch.relu({0})", True, False),
    ("torch.exp({0})", False, False),
    ("torch.exp2({0})", False, False),
    ("torch.expm1({0})", False, False),
    ("torch.log({0})", False, True),
    ("torch.log1p({0}.abs())", False, False),
    ("torch.log2({0})", False, True),
    ("torch.sqrt({0})", False, True),
    ("torch.sqrt({0}.abs())", False, False),
    ("torch.rsqrt({0})", False, True),
    ("torch.sin({0})", False, False),
    ("torch.cos({0})", False, False),
    ("torch.tanh({0})", False, False),
    ("torch.sigmoid({0})", False, False),
    ("torch.erf({0})", False, False),
    ("torch.atan({0})", False, False),
    ("torch.asinh({0})", False, False),
    ("torch.reciprocal({0})", False, True),
    ("torch.square({0})", False, False),
    (F + ".gelu({0})", False, False),
    (F + ".gelu({0}, approximate='tanh')", False, False),
    (F + ".silu({0})", False, False),
    (F + ".softplus({0})", False, False),
    (F + ".elu({0})", False, False),
    (F + ".leaky_relu({0}, 0.1)", False, False),
    (F + ".hardtanh({0})", True, False),
    (F + ".hardswish({0})", False, False),
    (F + ".mish({0})", False, False),
    ("torch.floor({0})", True, True),
    ("torch.ceil({0})", True, True),
    ("torch.round({0})", True, True),
    ("torch.trunc({0})", True, True),
    ("torch.frac({0})", True, True),
    ("torch.sign({0})", True, True),
    ("torch.signbit({0})", True, True),
    ("torch.bitwise_not({0})", True, True),
    ("torch.logical_not({0})", True, True),
    ("torch.isnan({0})", True, True),
    ("torch.isinf({0})", True, True),
    ("torch.isfinite({0})", True, True),
    ("torch.nan_to_num({0})", True, False),
    ("torch.clamp({0}, -0.5, 2.0)", True, False),
    ("torch.clamp({0}, min=-3)", True, False),
    ("{0} * 2", True, False),
    ("{0} + 1", False, False),
    ("1 - {0}", False, False),
    ("{0} / 3", False, False),
]

BINARY = [
    ("torch.add({0}, {1})", False, False),
    ("torch.sub({0}, {1})", False, False),
    ("torch.mul({0}, {1})", False, False),
    ("torch.div({0}, {1})", False, False),
    ("torch.add({0}, {1}, alpha=2)", False, False),
    ("{0} * {1} + {0}", False, False),
    ("torch.maximum({0}, {1})", True, False),
    ("torch.minimum({0}, {1})", True, False),
    ("torch.fmax({0}, {1})", True, False),
    ("torch.fmin({0}, {1})", True, False),
    ("torch.pow({0}, {1})", False, False),
    ("torch.atan2({0}, {1})", False, False),
    ("torch.hypot({0}, {1})", False, False),
    ("torch.copysign({0}, {1})", True, True),
    ("torch.lerp({0}, {1}, 0.3)", False, False),
    ("torch.eq({0}, {1})", True, True),
    ("torch.ne({0}, {1})", True, True),
    ("torch.lt({0}, {1})", True, True),
    ("torch.le({0}, {1})", True, True),
    ("torch.gt({0}, {1})", True, True),
    ("torch.ge({0}, {1})", True, True),
    ("torch.logical_and({0}, {1})", True, True),
    ("torch.logical_or({0}, {1})", True, True),
    ("torch.logical_xor({0}, {1})", True, True),
    ("torch.bitwise_and({0}, {1})", True, True),
    ("torch.bitwise_or({0}, {1})", True, True),
    ("torch.bitwise_xor({0}, {1})", True, True),
    ("torch.div({0}, {1}, rounding_mode='floor')", True, True),
    ("torch.div({0}, {1}, rounding_mode='trunc')", True, True),
    ("torch.remainder({0}, {1})", True, True),
    ("torch.fmod({0}, {1})", True, True),
]

# Integer division only by a divisor that cannot be 0: division by zero is undefined in C++
# (and eager raises), so a program dividing integers by 0 has no expected result.
INT_DIVISION = [
    "torch.div({0}, {1}.abs() + 1, rounding_mode='floor')",
    "torch.div({0}, {1}.abs() + 1, rounding_mode='trunc')",
    "torch.remainder({0}, {1}.abs() + 1)",
    "torch.fmod({0}, {1}.abs() + 1)",
    "{0} // ({1}.abs() + 1)",
]

FLOAT_SCALARS = ("0.5", "-1.5", "2.0", "3.0", "1e-3", "0.0", "-0.0", "float('inf')", "1e4")
INT_SCALARS = ("-3", "0", "1", "2", "7")


def _kind(t: torch.Tensor) -> str:
    return "float" if t.is_floating_point() else "bool" if t.dtype == torch.bool else "int"


def _partner_shape(ctx: Context, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against shape: some leading dims dropped, some set to 1."""
    rng = ctx.rng
    keep = shape[rng.randint(0, len(shape)) :] if rng.random() < 0.3 else shape
    return tuple(1 if rng.random() < 0.3 else s for s in keep)


def _broadcasts(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.broadcast_shapes(a.shape, b.shape)
        return True
    except RuntimeError:
        return False


def operand(ctx: Context, name: str, scalars: bool = True) -> str:
    """A second operand for name: a value it broadcasts with, a new input, or a literal."""
    rng, t = ctx.rng, ctx.t(name)
    r = rng.random()
    if r < 0.3:
        found = ctx.pick(lambda u: _broadcasts(t, u))
        if found:
            return found
    if r < 0.85 or not scalars:
        dtype = str(t.dtype).removeprefix("torch.") if rng.random() < 0.65 else ctx.dtype()
        return ctx.new_input(_partner_shape(ctx, tuple(t.shape)), dtype)
    return rng.choice(INT_SCALARS if rng.random() < 0.3 else FLOAT_SCALARS)


def unary(ctx: Context) -> Draw | None:
    fmt, preserves, needs_exact = ctx.rng.choice(UNARY)
    return Draw(fmt, (ctx.pick(),), preserves, needs_exact)


def binary(ctx: Context) -> Draw | None:
    a = ctx.pick()
    fmt, preserves, needs_exact = ctx.rng.choice(BINARY)
    return Draw(fmt, (a, operand(ctx, a)), preserves, needs_exact)


def int_division(ctx: Context) -> Draw | None:
    a = ctx.pick(lambda t: _kind(t) == "int")
    if a is None:
        return None
    b = ctx.pick(lambda t: _kind(t) == "int" and _broadcasts(t, ctx.t(a)))
    if b is None or ctx.rng.random() < 0.5:
        b = ctx.new_input(_partner_shape(ctx, tuple(ctx.t(a).shape)), ctx.rng.choice(("int32", "int64")))
    return Draw(ctx.rng.choice(INT_DIVISION), (a, b), True)


def select(ctx: Context) -> Draw | None:
    a = ctx.pick()
    t = ctx.t(a)
    cond = ctx.pick(lambda u: u.dtype == torch.bool and _broadcasts(u, t))
    if cond is None or ctx.rng.random() < 0.5:
        cond = ctx.new_input(_partner_shape(ctx, tuple(t.shape)), "bool")
    if ctx.rng.random() < 0.5:
        return Draw("torch.where({0}, {1}, {2})", (cond, a, operand(ctx, a)), True, False)
    literal = ctx.rng.choice(FLOAT_SCALARS if t.is_floating_point() else INT_SCALARS)
    return Draw("{1}.masked_fill({0}, " + literal + ")", (cond, a), True)


def cast(ctx: Context) -> Draw | None:
    a = ctx.pick()
    src, dst = _kind(ctx.t(a)), ctx.dtype()
    if src == "float" and dst in ("int32", "int64"):
        # float -> int of NaN, inf or out-of-range values is undefined (C++ and eager differ)
        fmt = (
            "torch.nan_to_num({0}, nan=0.0, posinf=0.0, neginf=0.0).clamp(-1000, 1000).to(torch." + dst + ")"
        )
        return Draw(fmt, (a,), True, True)
    method = {"float32": "float()", "float16": "half()", "bfloat16": "bfloat16()"}.get(dst)
    fmt = "{0}." + method if method and ctx.rng.random() < 0.3 else "{0}.to(torch." + dst + ")"
    return Draw(fmt, (a,), True, src == "float" and dst == "bool")


def _dims(ctx: Context, rank: int, single: bool = False) -> tuple[str, list[int] | None]:
    """(', dim=...', dims) over a random subset of dims (negative at times), or ('', None): all."""
    rng = ctx.rng
    if rank == 0 or rng.random() < 0.2:
        return "", None
    chosen = rng.sample(range(rank), 1 if single else rng.randint(1, rank))
    shown = [d - rank if rng.random() < 0.3 else d for d in chosen]
    return (f", dim={shown[0]}" if single else f", dim={shown}"), chosen


REDUCTIONS = [
    # (format with {dims} and {keep}, single dim only, preserves, needs exact)
    ("torch.sum({0}{dims}{keep})", False, False, False),
    ("torch.mean({0}{dims}{keep})", False, False, False),
    ("torch.nansum({0}{dims}{keep})", False, False, False),
    ("torch.prod({0}{dims}{keep})", True, False, False),
    ("torch.amax({0}{dims}{keep})", False, True, False),
    ("torch.amin({0}{dims}{keep})", False, True, False),
    ("torch.var({0}{dims}{keep})", False, False, False),
    ("torch.std({0}{dims}, correction=0{keep})", False, False, False),
    ("torch.logsumexp({0}{dims}{keep})", False, False, False),
    ("torch.linalg.vector_norm({0}, ord=2{dims}{keep})", False, False, False),
    ("torch.linalg.vector_norm({0}, ord=1{dims}{keep})", False, False, False),
    ("torch.linalg.vector_norm({0}, ord=float('inf'){dims}{keep})", False, True, False),
    ("torch.any({0}{dims}{keep})", True, True, True),
    ("torch.all({0}{dims}{keep})", True, True, True),
    ("torch.argmax({0}{dims}{keep})", True, True, True),
    ("torch.argmin({0}{dims}{keep})", True, True, True),
    ("torch.count_nonzero({0}{dims})", False, True, True),
    ("torch.sum({0}{dims}{keep}, dtype=torch.float32)", False, False, False),
    ("torch.cumsum({0}{dims})", True, False, False),
]


def reduction(ctx: Context) -> Draw | None:
    a = ctx.pick()
    fmt, single, preserves, needs_exact = ctx.rng.choice(REDUCTIONS)
    dims, _ = _dims(ctx, ctx.t(a).dim(), single)
    if "cumsum" in fmt and not dims:
        return None
    keep = ", keepdim=True" if dims and ctx.rng.random() < 0.4 else ""
    return Draw(fmt.replace("{dims}", dims).replace("{keep}", keep), (a,), preserves, needs_exact)


def normalization(ctx: Context) -> Draw | None:
    rng = ctx.rng
    a = ctx.pick(lambda t: t.is_floating_point() and t.dim() >= 1)
    if a is None:
        return None
    t = ctx.t(a)
    d = rng.randrange(t.dim()) - (t.dim() if rng.random() < 0.5 else 0)
    choice = rng.randrange(6)
    if choice == 0:
        return Draw(f"torch.softmax({{0}}, dim={d})", (a,))
    if choice == 1:
        return Draw(f"torch.log_softmax({{0}}, dim={d})", (a,))
    if choice == 2:
        return Draw(f"torch.softmax({{0}}, dim={d}, dtype=torch.float32)", (a,))
    if choice == 3:
        return Draw(f"{F}.normalize({{0}}, dim={d})", (a,))
    k = rng.randint(1, min(2, t.dim()))
    shape = list(t.shape[-k:])
    if choice == 4:
        if rng.random() < 0.5:
            dt = str(t.dtype).removeprefix("torch.")
            w, b = ctx.new_input(tuple(shape), dt), ctx.new_input(tuple(shape), dt)
            return Draw(f"{F}.layer_norm({{0}}, {shape}, {{1}}, {{2}})", (a, w, b))
        return Draw(f"{F}.layer_norm({{0}}, {shape})", (a,))
    return Draw(f"{F}.rms_norm({{0}}, {shape}, eps=1e-6)", (a,))


def batch_norm(ctx: Context) -> Draw | None:
    a = ctx.pick(lambda t: t.is_floating_point() and t.dim() >= 2)
    if a is None:
        return None
    return Draw(f"{F}.batch_norm({{0}}, None, None, training=True)", (a,))


def _factor_shape(ctx: Context, numel: int) -> list[int]:
    """A random shape with numel elements."""
    if numel == 0:
        return [0, ctx.rng.choice((1, 3))] if ctx.rng.random() < 0.5 else [0]
    factors, n, p = [], numel, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    rank = ctx.rng.randint(1, 4)
    dims = [1] * rank
    for f in factors:
        dims[ctx.rng.randrange(rank)] *= f
    return dims


def _slice(ctx: Context, size: int) -> str:
    rng = ctx.rng
    r = rng.random()
    if r < 0.25:
        return ":"
    if r < 0.45:
        return f"::{rng.randint(2, 3)}"
    if r < 0.6:
        return f"{rng.randint(0, max(size - 1, 0))}::{rng.randint(2, 3)}"
    if r < 0.75:
        return f"{rng.randint(0, size)}:{rng.randint(-2, size)}"
    if r < 0.85 and size > 0:
        return str(rng.randrange(-size, size))
    return "None" if r < 0.93 else f"-{rng.randint(1, 3)}:"


def view(ctx: Context) -> Draw | None:
    rng = ctx.rng
    a = ctx.pick()
    t = ctx.t(a)
    r, n = t.dim(), t.numel()
    choice = rng.randrange(14)
    if choice == 0:
        return Draw(f"{{0}}.reshape({_factor_shape(ctx, n)})", (a,), True)
    if choice == 1:
        return Draw(f"{{0}}.view({_factor_shape(ctx, n)})", (a,), True)
    if choice == 2 and r >= 2:
        perm = list(range(r))
        rng.shuffle(perm)
        return Draw(f"{{0}}.permute({perm})", (a,), True)
    if choice == 3 and r >= 2:
        i, j = rng.sample(range(r), 2)
        return Draw(f"{{0}}.transpose({i}, {j})", (a,), True)
    if choice == 4:
        return Draw(f"{{0}}.unsqueeze({rng.randint(-r - 1, r)})", (a,), True)
    if choice == 5 and r >= 1:
        return Draw(
            f"{{0}}.squeeze({rng.randrange(r)})" if rng.random() < 0.7 else "{0}.squeeze()", (a,), True
        )
    if choice == 6 and r >= 1:
        return Draw(
            "{0}[" + ", ".join(_slice(ctx, s) for s in t.shape[: rng.randint(1, r)]) + "]", (a,), True
        )
    if choice == 7 and r >= 1:
        sizes = [rng.choice((2, 3)) if s == 1 and rng.random() < 0.7 else s for s in t.shape]
        lead = [rng.choice((2, 3))] if rng.random() < 0.3 else []
        return Draw(f"{{0}}.expand({lead + sizes})", (a,), True)
    if choice == 8 and r >= 1:
        d = rng.randrange(r)
        s = t.shape[d]
        start = rng.randint(0, s)
        return Draw(f"{{0}}.narrow({d}, {start}, {rng.randint(0, s - start)})", (a,), True)
    if choice == 9 and r >= 2:
        d1, d2 = rng.sample(range(r), 2)
        return Draw(f"{{0}}.diagonal({rng.randint(-1, 1)}, {d1}, {d2})", (a,), True)
    if choice == 10 and r >= 1:
        d = rng.randrange(r)
        return Draw(f"{{0}}.unfold({d}, {rng.randint(1, 3)}, {rng.randint(1, 2)})", (a,), True)
    if choice == 11 and r >= 2:
        start = rng.randrange(r - 1)
        return Draw(f"{{0}}.flatten({start}, {rng.randint(start + 1, r - 1)})", (a,), True)
    if choice == 12:
        return Draw(rng.choice(("{0}.contiguous()", "{0}.clone()", "{0}.t()", "{0}.mT")), (a,), True)
    if choice == 13 and r >= 1:
        return Draw(f"{{0}}.select({rng.randrange(r)}, {rng.randint(-1, 0)})", (a,), True)
    return None


def _like(ctx: Context, t: torch.Tensor, shape: tuple[int, ...]) -> str:
    """An existing value of this shape, or a new input (same dtype mostly: cat promotes)."""
    found = ctx.pick(lambda u: tuple(u.shape) == tuple(shape))
    if found and ctx.rng.random() < 0.4:
        return found
    dtype = str(t.dtype).removeprefix("torch.") if ctx.rng.random() < 0.75 else ctx.dtype()
    return ctx.new_input(tuple(shape), dtype)


def rearrange(ctx: Context) -> Draw | None:
    rng = ctx.rng
    a = ctx.pick()
    t = ctx.t(a)
    r = t.dim()
    choice = rng.randrange(7)
    if choice == 0 and r >= 1:
        d = rng.randrange(r)
        shape = list(t.shape)
        shape[d] = rng.choice((0, 1, 2, 3, shape[d]))
        b = _like(ctx, t, tuple(shape))
        return Draw(f"torch.cat([{{0}}, {{1}}], dim={d - r if rng.random() < 0.3 else d})", (a, b), True)
    if choice == 1:
        return Draw(
            f"torch.stack([{{0}}, {{1}}], dim={rng.randint(0, r)})", (a, _like(ctx, t, tuple(t.shape))), True
        )
    if choice == 2 and r >= 1:
        dims = rng.sample(range(r), rng.randint(1, r))
        return Draw(f"torch.flip({{0}}, {dims})", (a,), True)
    if choice == 3 and r >= 1:
        k = rng.randint(1, r)
        dims = rng.sample(range(r), k)
        shifts = [rng.randint(-5, 5) for _ in dims]
        return Draw(f"torch.roll({{0}}, {shifts}, {dims})", (a,), True)
    if choice == 4:
        return Draw(f"torch.roll({{0}}, {rng.randint(-4, 4)})", (a,), True)
    if choice == 5:
        reps = [rng.randint(1, 3) for _ in range(max(r, rng.randint(1, 3)))]
        return Draw(f"{{0}}.repeat({reps})", (a,), True)
    if choice == 6 and r >= 2:
        d1, d2 = rng.sample(range(r), 2)
        return Draw(f"torch.rot90({{0}}, {rng.randint(-1, 2)}, [{d1}, {d2}])", (a,), True)
    return None


def indexing(ctx: Context) -> Draw | None:
    rng = ctx.rng
    a = ctx.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if a is None:
        return None
    t = ctx.t(a)
    r, shape = t.dim(), tuple(t.shape)
    d = rng.randrange(r)
    dtype = str(t.dtype).removeprefix("torch.")
    # indices into dim d whose other dims fit inside t (gather and scatter need that)
    inner = tuple(rng.randint(1, 3) if k == d else rng.randint(1, s) if s else 0 for k, s in enumerate(shape))
    choice = rng.randrange(11)
    if choice == 0:
        return Draw(f"torch.gather({{0}}, {d}, {{1}})", (a, ctx.index_input(inner, shape[d])), True)
    if choice == 1:
        return Draw(
            f"torch.index_select({{0}}, {d}, {{1}})",
            (a, ctx.index_input((rng.randint(0, 5),), shape[d])),
            True,
        )
    if choice == 2:
        idx_shape = ctx.shape(rng.randint(1, 2))
        return Draw("{0}[{1}]", (a, ctx.index_input(idx_shape, shape[0])), True)
    if choice == 3 and r >= 2 and shape[1] > 0:
        i = ctx.index_input((rng.randint(1, 4),), shape[0])
        j = ctx.index_input((1,) if rng.random() < 0.5 else (ctx.t(i).shape[0],), shape[1])
        return Draw("{0}[{1}, {2}]", (a, i, j), True)
    if choice == 4 and r >= 2:
        return Draw("{0}[:, {1}]", (a, ctx.index_input((rng.randint(1, 4),), shape[1])), True)
    if choice == 5:
        src = ctx.new_input(inner, dtype)
        fmt = f"torch.scatter_add({{0}}, {d}, {{1}}, {{2}})"
        return Draw(fmt, (a, ctx.index_input(inner, shape[d]), src), False)
    if choice == 6:
        red = rng.choice(("sum", "prod", "mean", "amax", "amin"))
        src = ctx.new_input(inner, dtype)
        include_self = rng.random() < 0.5
        fmt = f"torch.scatter_reduce({{0}}, {d}, {{1}}, {{2}}, reduce='{red}', include_self={include_self})"
        return Draw(fmt, (a, ctx.index_input(inner, shape[d]), src), red in ("amax", "amin"))
    if choice == 7:
        # distinct rows of dim 0, the same in every column: no two writes to one element
        k = rng.randint(1, shape[0])
        rows = (k,) + tuple(rng.randint(1, s) if s else 0 for s in shape[1:])
        view = ", ".join(str(s) for s in (k,) + (1,) * (r - 1))
        fmt = f"torch.scatter({{0}}, 0, {{1}}.view({view}).expand({list(rows)}), {{2}})"
        return Draw(fmt, (a, ctx.perm_input(k, shape[0]), ctx.new_input(rows, dtype)), True)
    if choice == 8:
        k = rng.randint(1, shape[0])
        vals = ctx.new_input((k,) + shape[1:], dtype)
        if rng.random() < 0.5:
            return Draw("{0}.index_put(({1},), {2})", (a, ctx.perm_input(k, shape[0]), vals), True)
        return Draw("{0}.index_put(({1},), {2}, accumulate=True)", (a, ctx.index_input((k,), shape[0]), vals))
    if choice == 9:
        k = rng.randint(1, 4)
        src_shape = shape[:d] + (k,) + shape[d + 1 :]
        if rng.random() < 0.5:
            idx = ctx.index_input((k,), shape[d])
            return Draw(f"{{0}}.index_add({d}, {{1}}, {{2}})", (a, idx, ctx.new_input(src_shape, dtype)))
        k = min(k, shape[d])
        src_shape = shape[:d] + (k,) + shape[d + 1 :]
        idx = ctx.perm_input(k, shape[d])
        return Draw(f"{{0}}.index_copy({d}, {{1}}, {{2}})", (a, idx, ctx.new_input(src_shape, dtype)), True)
    if choice == 10 and r == 2:
        idx = ctx.index_input(ctx.shape(rng.randint(1, 2)), shape[0])
        return Draw(f"{F}.embedding({{1}}, {{0}})", (a, idx), True)
    return None


def matmul(ctx: Context) -> Draw | None:
    rng = ctx.rng
    a = ctx.pick(lambda t: 1 <= t.dim() <= 3 and (t.is_floating_point() or t.dtype == torch.int64))
    if a is None:
        return None
    t = ctx.t(a)
    dtype, k, n = str(t.dtype).removeprefix("torch."), t.shape[-1], ctx.dim()
    choice = rng.randrange(5)
    if choice == 0:
        return Draw("{0} @ {1}", (a, ctx.new_input((k, n) if rng.random() < 0.8 else (k,), dtype)))
    if choice == 1 and t.dim() == 3:
        w_shape = (t.shape[0], k, n) if rng.random() < 0.5 else (1, k, n)
        return Draw("torch.matmul({0}, {1})", (a, ctx.new_input(w_shape, dtype)))
    if choice == 2:
        w = ctx.new_input((n, k), dtype)
        if rng.random() < 0.5:
            return Draw(f"{F}.linear({{0}}, {{1}}, {{2}})", (a, w, ctx.new_input((n,), dtype)))
        return Draw(f"{F}.linear({{0}}, {{1}})", (a, w))
    if choice == 3 and t.dim() == 2:
        bias = ctx.new_input(_partner_shape(ctx, (t.shape[0], n)), dtype)
        return Draw("torch.addmm({2}, {0}, {1})", (a, ctx.new_input((k, n), dtype), bias))
    if choice == 4 and t.dim() == 3:
        return Draw("torch.bmm({0}, {1})", (a, ctx.new_input((t.shape[0], k, n), dtype)))
    return None


INPLACE = [
    # (format, preserves exactness)
    ("{0}.add_({1})", False),
    ("{0}.mul_({1})", False),
    ("{0}.sub_({1}, alpha=2)", False),
    ("{0}.copy_({1})", True),
    ("{0}.clamp_(-1, 1)", True),
    ("{0}.fill_(3)", True),
    ("{0}.zero_()", True),
    ("{0}.relu_()", True),
    ("{0}.neg_()", True),
    ("{0}.exp_()", False),
    ("{0}.div_({1})", False),
    ("{0}.masked_fill_({1} > 0, 2)", True),
    ("{0}.maximum({1}, out={0})", True),
]


def inplace(ctx: Context) -> Draw | None:
    """An update of an input (mostly) or an intermediate, possibly through a view."""
    rng = ctx.rng
    input_names = [s.name for s in ctx.inputs if s.kind == "value"]
    a = rng.choice(input_names) if input_names and rng.random() < 0.6 else ctx.pick()
    t = ctx.t(a)
    if rng.random() < 0.3 and t.dim() >= 1:
        index = ", ".join(_slice(ctx, s) for s in t.shape[: rng.randint(1, t.dim())])
        try:
            target_shape = tuple(t[eval(f"numpy_index[{index}]", {"numpy_index": _Index()})].shape)
        except Exception:  # noqa: BLE001 - not a valid index of t
            return None
        value = ctx.new_input(_partner_shape(ctx, target_shape), str(t.dtype).removeprefix("torch."))
        return Draw("{0}[" + index + "] = {1}", (a, value), True, inplace=True)
    fmt, preserves = rng.choice(INPLACE)
    if "{1}" in fmt:
        scalars = not any(w in fmt for w in ("maximum", "masked"))
        b = operand(ctx, a, scalars=scalars)
        return Draw(fmt, (a, b), preserves, needs_exact="masked" in fmt, inplace=True)
    return Draw(fmt, (a,), preserves, inplace=True)


class _Index:
    """Turns `x[...]` source into the index object itself (to find the updated slice's shape)."""

    def __getitem__(self, index):
        return index


FAMILIES = [
    (unary, 4),
    (binary, 5),
    (int_division, 0.7),
    (select, 1),
    (cast, 1.2),
    (reduction, 3),
    (normalization, 1.5),
    (batch_norm, 0.3),
    (view, 3),
    (rearrange, 2),
    (indexing, 2.5),
    (matmul, 1.5),
    (inplace, 1.5),
]

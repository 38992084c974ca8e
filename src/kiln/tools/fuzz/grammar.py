"""Program generation: deterministic from (seed, index). Each statement is drawn from an op
family (families.py) and run in eager on the real inputs at once, so that every program is
valid, typed and shaped by construction, and a statement eager rejects is drawn again.

Exactness: a floating value is "exact" when every correct compiler must compute it bit for
bit like eager (inputs, views, copies, max/min, indexing of exact values). Ops whose result
jumps on a one-ulp change of their argument (comparisons, rounding, casts to integers,
argmax, domain edges of log/sqrt) take only exact values, because fused float arithmetic
(kept in fp32, contracted, summed in another order) legitimately differs from eager by ulps.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass

import torch

from kiln.tools.fuzz.program import DTYPES, FLOAT_DTYPES, InputSpec, Program, Stmt, load, render_input

# Known kiln bugs, each named, that the CI budget does not generate until it is fixed
# (docs/conformance.md lists them). `--no-exclusions` generates them again.
KNOWN_BUGS: dict[str, str] = {}

ZERO_SIZE_SHARE = 0.015


@dataclass(frozen=True)
class Profile:
    """Shapes and features of a run: "cpu" (the C++ path) or "tiny" (Triton's interpreter)."""

    dims: tuple[int, ...]
    max_stmts: int
    grad_share: float
    max_numel: int = 2048  # values past this are drawn again: programs stay small and fast


PROFILES = {
    "cpu": Profile(dims=(1, 1, 2, 3, 4, 5, 6, 8, 16), max_stmts=9, grad_share=0.25),
    "tiny": Profile(dims=(1, 2, 3, 4), max_stmts=4, grad_share=0.25),
    # sizes where kiln tiles, vectorizes with tails and splits reductions
    "wide": Profile(
        dims=(1, 2, 3, 7, 17, 64, 100, 257, 1024), max_stmts=6, grad_share=0.2, max_numel=1 << 16
    ),
}


@dataclass(frozen=True)
class Draw:
    """What an op family proposes: `fmt.format(*args)`, args being value names or literals.
    preserves: exact arguments give an exact result. needs_exact: floating arguments must be
    exact. inplace: the statement updates args[0] instead of naming a new value."""

    fmt: str
    args: tuple[str, ...]
    preserves: bool = False
    needs_exact: bool = False
    inplace: bool = False


class Context:
    """The program being generated: inputs, statements, and each value's eager tensor."""

    def __init__(self, rng: random.Random, profile: Profile, excluded: frozenset[str], grad: bool):
        self.rng, self.profile, self.excluded, self.grad = rng, profile, excluded, grad
        self.inputs: list[InputSpec] = []
        self.stmts: list[Stmt] = []
        self.env: dict = {"torch": torch}
        self.exact: dict[str, bool] = {}
        self.values: list[str] = []  # names of inputs and statement results, in order

    # -- values ------------------------------------------------------------------------
    def t(self, name: str) -> torch.Tensor:
        return self.env[name]

    def names(self, pred=None) -> list[str]:
        return [n for n in self.values if pred is None or pred(self.env[n])]

    def pick(self, pred=None) -> str | None:
        """A value, the newest ones more often (chains of ops are what fusion works on)."""
        found = self.names(pred)
        if not found:
            return None
        if self.rng.random() < 0.5:
            return found[-1]
        return self.rng.choice(found)

    def excludes(self, bug: str) -> bool:
        return bug in self.excluded

    # -- shapes and inputs -------------------------------------------------------------
    def dim(self) -> int:
        """A size; 0 rarely (a zero-size dim empties the whole program)."""
        return 0 if self.rng.random() < ZERO_SIZE_SHARE else self.rng.choice(self.profile.dims)

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        if rank is None:
            rank = self.rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4))
        dims = [self.dim() for _ in range(rank)]
        while math.prod(dims) > self.profile.max_numel:
            dims[dims.index(max(dims))] = self.rng.choice((1, 2, 3))
        return tuple(dims)

    def dtype(self) -> str:
        return self.rng.choices(DTYPES, weights=(6, 1.5, 1.5, 1, 1.5, 1))[0]

    def new_input(self, shape: tuple[int, ...], dtype: str, kind: str = "value", high: int = 0) -> str:
        rng = self.rng
        layout, expand_dims, special_at = "contiguous", (), ()
        if kind == "value":
            layout = rng.choices(("contiguous", "transposed", "strided", "expanded"), (6, 1.5, 1.5, 1.5))[0]
            if layout == "expanded":
                expand_dims = tuple(d for d, s in enumerate(shape) if s > 1 and rng.random() < 0.6)
                layout = layout if expand_dims else "contiguous"
            if dtype in FLOAT_DTYPES and rng.random() < 0.25:
                special_at = tuple(rng.randrange(1 << 16) for _ in range(rng.randint(1, 3)))
        grad = self.grad and kind == "value" and dtype in FLOAT_DTYPES
        spec = InputSpec(
            name=f"x{len(self.inputs)}",
            shape=tuple(shape),
            dtype=dtype,
            seed=rng.randrange(1 << 30),
            kind=kind,
            high=high,
            layout=layout,
            expand_dims=expand_dims,
            special_at=special_at,
            grad=grad,
        )
        exec("\n".join(render_input(spec)), self.env)  # noqa: S102 - generated source
        self.inputs.append(spec)
        self.values.append(spec.name)
        self.exact[spec.name] = True
        return spec.name

    def index_input(self, shape: tuple[int, ...], high: int) -> str:
        return self.new_input(shape, "int64", kind="index", high=high)

    def perm_input(self, length: int, high: int) -> str:
        return self.new_input((length,), "int64", kind="perm", high=high)

    # -- statements --------------------------------------------------------------------
    def try_add(self, draw: Draw) -> bool:
        """Run the statement in eager; keep it if eager accepts it and the result is small."""
        if draw.needs_exact and not all(self._exact_arg(a) for a in draw.args):
            return False
        target = "" if draw.inplace else f"v{len(self.stmts)}"
        stmt = Stmt(target, draw.fmt, draw.args)
        before = (
            {
                n: (t.clone() if isinstance(t, torch.Tensor) else t)
                for n, t in self.env.items()
                if n in self.exact
            }
            if draw.inplace
            else None
        )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(stmt.source(), self.env)  # noqa: S102 - generated source
        except Exception:  # noqa: BLE001 - eager rejects this statement: draw another
            if before is not None:
                self._restore(before)
            self.env.pop(target, None)
            return False
        out = self.env[draw.args[0] if draw.inplace else target]
        if (
            not isinstance(out, torch.Tensor)
            or out.numel() > self.profile.max_numel
            or out.dim() > 5
            or out.is_complex()
        ):
            if before is not None:
                self._restore(before)
            self.env.pop(target, None)
            return False
        exact = all(self._exact_arg(a) for a in draw.args) and (draw.preserves or not out.is_floating_point())
        self.stmts.append(stmt)
        if draw.inplace:
            if not exact:
                self._taint(out)
        else:
            self.values.append(target)
            self.exact[target] = exact
        return True

    def _exact_arg(self, arg: str) -> bool:
        return self.exact.get(arg, True)

    def _restore(self, before: dict) -> None:
        """Undo a rejected in-place statement (an expanded value cannot be written: draw anew)."""
        with torch.no_grad():
            for n, t in before.items():
                if isinstance(t, torch.Tensor) and not torch.equal(self.env[n], t):
                    try:
                        self.env[n].copy_(t)
                    except RuntimeError as e:
                        raise _Redraw(f"cannot undo a rejected update of {n}") from e

    def _taint(self, updated: torch.Tensor) -> None:
        """An inexact in-place update makes every value sharing its storage inexact."""
        storage = updated.untyped_storage().data_ptr()
        for n in self.values:
            if self.env[n].untyped_storage().data_ptr() == storage:
                self.exact[n] = False


def generate(
    seed: int,
    index: int,
    profile: str = "cpu",
    excluded: frozenset[str] = frozenset(KNOWN_BUGS),
    attempts: int = 20,
) -> Program:
    """The program (seed, index): the first of its attempts that eager runs, gradients included."""
    last_error: Exception | None = None
    for attempt in range(attempts):
        rng = random.Random(f"{seed}/{index}/{attempt}")
        try:
            program = _draw(rng, seed, index, PROFILES[profile], excluded)
        except _Redraw as e:
            last_error = e
            continue
        try:
            check_eager(program)
            return program
        except Exception as e:  # noqa: BLE001 - eager fails: draw the program again
            last_error = e
    raise RuntimeError(f"no valid program for seed {seed} index {index}: {last_error}")


class _Redraw(Exception):
    pass


def _draw(rng: random.Random, seed: int, index: int, profile: Profile, excluded: frozenset[str]) -> Program:
    from kiln.tools.fuzz.families import FAMILIES

    ctx = Context(rng, profile, excluded, grad=rng.random() < profile.grad_share)
    for _ in range(rng.choice((1, 1, 2))):
        ctx.new_input(ctx.shape(), ctx.dtype())
    families, weights = zip(*[(f, w) for f, w in FAMILIES if not (ctx.grad and f.__name__ == "inplace")])
    n_stmts = rng.randint(1, profile.max_stmts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(n_stmts):
            for _ in range(40):
                n_inputs = len(ctx.inputs)
                draw = rng.choices(families, weights)[0](ctx)
                if draw is not None and ctx.try_add(draw):
                    break
                _drop_inputs(ctx, n_inputs)
    if not ctx.stmts:
        raise _Redraw("no statement")
    outputs = _outputs(ctx)
    if not outputs:
        raise _Redraw("no output")
    exact = frozenset(n for n, e in ctx.exact.items() if e)
    return Program(
        seed=seed,
        index=index,
        inputs=tuple(ctx.inputs),
        stmts=tuple(ctx.stmts),
        outputs=tuple(outputs),
        grad=ctx.grad,
        exact=exact,
    )


def _drop_inputs(ctx: Context, keep: int) -> None:
    for spec in ctx.inputs[keep:]:
        ctx.values.remove(spec.name)
        ctx.exact.pop(spec.name)
        ctx.env.pop(spec.name)
    del ctx.inputs[keep:]


def _outputs(ctx: Context) -> list[str]:
    """The last statement's value (or the value it updates), and up to two others."""
    last = ctx.stmts[-1]
    first = last.target or last.args[0]
    others = [n for n in ctx.values if n.startswith("v") and n != first]
    chosen = [first] + ctx.rng.sample(others, min(len(others), ctx.rng.choice((0, 0, 1, 2))))
    return chosen


def check_eager(program: Program) -> None:
    """Raise if eager fails on the program (its outputs, and its gradients if it has them)."""
    ns = load(program)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inputs = ns["make_inputs"]()
        outs = ns["f"](*inputs)
        if program.grad:
            from kiln.tools.fuzz.compare import grad_targets

            targets = grad_targets(outs, inputs, seed=program.seed)
            if targets is None:
                raise ValueError("no output depends on an input that requires grad")
            torch.autograd.grad(*targets, allow_unused=True)

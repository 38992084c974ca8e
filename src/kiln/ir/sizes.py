"""Sizes: an int, or a sympy expression over the size symbols of a graph's shape family.

Dynamo traces a graph with symbolic shapes as a family: each dynamic dimension is a symbol
(s0, s1, ...) of its ShapeEnv, with the facts its guards establish (every size symbol is at
least 2: Dynamo specializes 0 and 1). kiln carries those symbols through both IRs and the
host program, so that one program serves every size of the family.

Two kinds of question are asked of a size:
- correctness (may this index be split? is this row short enough to keep?): answered by
  known_le/known_lt/known_eq, which hold only where they hold for every size of the family,
  by sympy's assumptions or by the facts of the ShapeEnv, and never add a guard;
- speed (which loop goes inside? is this kernel worth threads?): answered by hint(), the size
  the traced example had, which adds no guard either.
A step that needs a number and has none raises NeedsNumber: the graph then compiles per shape.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from typing import Any, Iterator, Union


class _Sympy:
    """sympy, imported at its first use: a process that only runs programs of fixed sizes
    (a loaded artifact) never needs it, and importing it takes a large part of a load."""

    def __getattr__(self, name: str) -> Any:
        import sympy as module

        globals()["sympy"] = module
        return getattr(module, name)


sympy: Any = _Sympy()

Size = Union[int, "sympy.Expr"]


def _is_sympy(value: Any) -> bool:
    """Whether value is a sympy object (none can be before sympy is imported)."""
    return "sympy" in sys.modules and isinstance(value, sympy.Basic)


class NeedsNumber(Exception):
    """A step of the compile needs a size's value: the graph compiles per shape instead."""


# the ShapeEnv of the family being compiled (None: sizes are ints, or facts are sympy's alone)
_FAMILY: contextvars.ContextVar[Any] = contextvars.ContextVar("kiln_shape_family", default=None)


@contextlib.contextmanager
def family(shape_env: Any) -> Iterator[None]:
    """Answer comparisons and hints from this ShapeEnv's facts while compiling."""
    token = _FAMILY.set(shape_env)
    try:
        yield
    finally:
        _FAMILY.reset(token)


def shape_env() -> Any:
    return _FAMILY.get()


def as_size(value: Any) -> Size:
    """A size from an int, a torch.SymInt or a sympy expression (an int where it is one)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    node = getattr(value, "node", None)
    if node is not None and hasattr(node, "expr"):  # a torch.SymInt
        maybe = node.maybe_as_int() if hasattr(node, "maybe_as_int") else None
        value = maybe if maybe is not None else node.expr
    if isinstance(value, int):
        return value
    if _is_sympy(value):
        if value.is_Integer:
            return int(value)
        return value
    if hasattr(value, "__index__"):
        return int(value.__index__())
    raise TypeError(f"not a size: {value!r}")


def is_symbolic(s: Any) -> bool:
    return _is_sympy(s) and not s.is_Integer


def symbols(*sizes: Any) -> set[sympy.Symbol]:
    """The size symbols of sizes (which may be nested tuples)."""
    out: set[sympy.Symbol] = set()
    for s in sizes:
        if isinstance(s, (tuple, list)):
            out |= symbols(*s)
        elif _is_sympy(s):
            out |= s.free_symbols
    return out


def simplify(s: Size) -> Size:
    if _is_sympy(s):
        s = sympy.expand(_exact_floordivs(s))
        return int(s) if s.is_Integer else s
    return s


def _is_max_min(e: Any) -> str | None:
    """"max" or "min" for sympy's and torch's Max and Min."""
    name = type(e).__name__
    return name.lower() if name in ("Max", "Min") and isinstance(e, sympy.Basic) else None


def _decided_max_min(e: sympy.Basic) -> sympy.Basic:
    """Max(1, s0 - 1) as s0 - 1 where the family's facts decide it (eager's strides use Max)."""
    if not any(_is_max_min(x) for x in sympy.preorder_traversal(e)):
        return e

    def decide(x):
        a, b = x.args[0], x.args[1] if len(x.args) == 2 else None
        if b is None:
            return x
        larger = b if known_le(a, b) else a if known_le(b, a) else None
        if larger is None:
            return x
        smaller = a if larger is b else b
        return larger if _is_max_min(x) == "max" else smaller

    return e.replace(lambda x: _is_max_min(x) is not None, decide)


def _exact_floordivs(e: sympy.Basic) -> sympy.Basic:
    """FloorDiv(a, b) as a / b where b divides a for every size (a reshape's s0 * s1 // s1)."""
    e = _decided_max_min(e)
    fd = _floordiv_class()
    if fd is None or not e.has(fd):
        return e

    def exact(a, b):
        q = sympy.cancel(a / b)
        return q if q.is_integer else fd(a, b)

    return e.replace(lambda x: isinstance(x, fd), lambda x: exact(*x.args))


def _decide(relation: Any) -> bool | None:
    """True or False where the relation holds (or fails) for every size of the family."""
    if relation is sympy.true or relation is True:
        return True
    if relation is sympy.false or relation is False:
        return False
    env = shape_env()
    # a quotient that is not a size (s0 * s1**-1) stays undecided: the ShapeEnv's range
    # analysis fails on it and logs a warning each time
    if env is not None and not any(p.exp.is_negative for p in relation.atoms(sympy.Pow)):
        try:
            value = env._maybe_evaluate_static(relation)
        except Exception:  # noqa: BLE001 - an expression the ShapeEnv cannot reason about
            value = None
        if value is not None and value.is_Boolean:
            return bool(value)
    return None


def known_le(a: Size, b: Size) -> bool:
    """a <= b for every size of the family (False where unknown)."""
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    return _decide(sympy.Le(sympy.sympify(a), sympy.sympify(b))) is True


def known_lt(a: Size, b: Size) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return _decide(sympy.Lt(sympy.sympify(a), sympy.sympify(b))) is True


def known_eq(a: Size, b: Size) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0:
        return True
    return _decide(sympy.Eq(sympy.sympify(a), sympy.sympify(b))) is True


def known_ne(a: Size, b: Size) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a != b
    return _decide(sympy.Ne(sympy.sympify(a), sympy.sympify(b))) is True


def known_divides(d: Size, n: Size) -> bool:
    """d divides n for every size of the family."""
    if isinstance(d, int) and isinstance(n, int):
        return d != 0 and n % d == 0
    if d == 0:
        return False
    q = sympy.cancel(sympy.sympify(n) / sympy.sympify(d))
    return bool(q.is_integer)


def exact_div(n: Size, d: Size) -> Size:
    """n / d where d divides n (known_divides)."""
    if isinstance(d, int) and isinstance(n, int):
        return n // d
    return simplify(sympy.cancel(sympy.sympify(n) / sympy.sympify(d)))


def smax(a: Size, b: Size) -> Size:
    if known_le(a, b):
        return b
    if known_le(b, a):
        return a
    return sympy.Max(a, b)


def smin(a: Size, b: Size) -> Size:
    if known_le(a, b):
        return a
    if known_le(b, a):
        return b
    return sympy.Min(a, b)


def hint(s: Any) -> int:
    """The value a size had in the traced example: for decisions of speed only (no guard)."""
    if isinstance(s, int):
        return s
    node = getattr(s, "node", None)
    if node is not None and getattr(node, "hint", None) is not None:  # a torch.SymInt's example
        return int(node.hint)
    if not isinstance(s, sympy.Basic):
        s = as_size(s)
        if isinstance(s, int):
            return s
    env = shape_env()
    values = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", None) or {}
    s = s.xreplace({k: sympy.Integer(v) for k, v in values.items()})
    # a size known only at run time (read from data) has no example: a typical one stands in
    return int(s.xreplace({k: sympy.Integer(UNBACKED_HINT) for k in s.free_symbols}))


UNBACKED_HINT = 8192  # the size a choice of speed assumes for a size read from data


def number(s: Any, why: str) -> int:
    """The int a size is; raises NeedsNumber (saying why it was needed) for a symbolic one."""
    if isinstance(s, int):
        return s
    s = as_size(s)
    if isinstance(s, int):
        return s
    raise NeedsNumber(f"{why} needs a number, the size is {s}")


def dense_strides(shape: tuple[Size, ...]) -> tuple[Size, ...]:
    """Row-major strides; a size of 0 or 1 counts as 1 (as PyTorch's contiguous strides do)."""
    strides: list[Size] = []
    acc: Size = 1
    for s in reversed(shape):
        strides.append(acc)
        acc = simplify(acc * (s if is_symbolic(s) else max(int(s), 1)))
    return tuple(reversed(strides))


def numel(shape: tuple[Size, ...]) -> Size:
    n: Size = 1
    for s in shape:
        n = n * s
    return simplify(n)


# --- rendering -----------------------------------------------------------------


def _floordiv_class() -> Any:
    try:
        from torch.utils._sympy.functions import FloorDiv

        return FloorDiv
    except ImportError:  # pragma: no cover - torch without its sympy functions
        return None


def _mod_classes() -> tuple:
    classes: list = [sympy.Mod]
    try:
        from torch.utils._sympy import functions as f

        classes += [c for c in (getattr(f, "PythonMod", None), getattr(f, "Mod", None)) if c is not None]
    except ImportError:  # pragma: no cover
        pass
    return tuple(classes)


def render(s: Size, names: dict | None = None, lang: str = "c") -> str:
    """A size as C or Python source, symbols by their name (or names[symbol]). Divisors are
    positive; a dividend not known to be non-negative (a roll's shift, -(n // 2) % n) is
    brought to its floor remainder by ((a % b) + b) % b, which C, Triton (both truncate) and
    Python compute alike."""
    if isinstance(s, int):
        return str(s)
    names = names or {}
    floordiv = _floordiv_class()

    def go(e: sympy.Basic) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            return str(names.get(e, e.name))
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=sympy.default_sort_key)
            return "(" + " + ".join(go(t) for t in terms) + ")"
        if isinstance(e, sympy.Mul):
            factors = sorted(e.args, key=sympy.default_sort_key)
            return "(" + " * ".join(go(f) for f in factors) + ")"
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + " * ".join([go(e.base)] * int(e.exp)) + ")"
        if floordiv is not None and isinstance(e, floordiv):
            a, b, div = go(e.args[0]), go(e.args[1]), "//" if lang == "python" else "/"
            if e.args[0].is_nonnegative:
                return f"({a} {div} {b})"
            return f"(({a} - ((({a} % {b}) + {b}) % {b})) {div} {b})"
        if isinstance(e, _mod_classes()):
            a, b = go(e.args[0]), go(e.args[1])
            return f"({a} % {b})" if e.args[0].is_nonnegative else f"((({a} % {b}) + {b}) % {b})"
        if isinstance(e, sympy.floor):  # sympy's own floor of a quotient: FloorDiv(-1, n) becomes floor(-1/n)
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if den != 1:
                a, b, div = go(num), go(den), "//" if lang == "python" else "/"
                return f"(({a} - ((({a} % {b}) + {b}) % {b})) {div} {b})"
        if _is_max_min(e):
            fn = _is_max_min(e) if lang == "python" else f"std::{_is_max_min(e)}<int64_t>"
            out = go(e.args[0])
            for a in e.args[1:]:
                out = f"{fn}({out}, {go(a)})"
            return out
        raise NeedsNumber(f"the size {e} has no {lang} form in kiln")

    return go(sympy.sympify(s))


@functools.cache
def _size_printer() -> Any:
    """str() of a size, except that a floor division is written FloorDiv(a, b): its own
    text (a//b) parses back as sympy's floor, not as the size it was. Made at first use, as
    sympy is imported."""

    class SizePrinter(sympy.printing.str.StrPrinter):
        def _print(self, e, **kwargs) -> str:
            floordiv = _floordiv_class()
            if floordiv is not None and isinstance(e, floordiv):
                return f"FloorDiv({self._print(e.args[0])}, {self._print(e.args[1])})"
            return super()._print(e, **kwargs)

    return SizePrinter()


def text(s: Size) -> str:
    """The text parse() reads back as s."""
    return str(s) if isinstance(s, int) else _size_printer().doprint(s)


def parse(text: str) -> Size:
    """A size from its text (text(size)): symbols are positive integers, as Dynamo's are."""
    if text.isdigit():
        return int(text)
    expr = sympy.sympify(text, locals=_parse_locals(text))
    return int(expr) if expr.is_Integer else expr


def _parse_locals(text: str) -> dict:
    import re

    names = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))
    out: dict = {n: sympy.Symbol(n, integer=True, positive=True) for n in names
                 if re.fullmatch(r"[su]\d+|ks\d+", n)}
    fd = _floordiv_class()
    if fd is not None:
        out["FloorDiv"] = fd
    return out


def size_symbol(name: str) -> sympy.Symbol:
    """A size symbol as Dynamo makes them: a positive integer."""
    return sympy.Symbol(name, integer=True, positive=True)


# --- size arithmetic of a traced graph --------------------------------------------

def _size_ops() -> dict:
    import operator

    import torch
    from torch.utils._sympy.functions import FloorDiv

    aten = torch.ops.aten
    ops = {
        operator.add: lambda a, b: a + b, operator.sub: lambda a, b: a - b,
        operator.mul: lambda a, b: a * b, operator.neg: lambda a: -a,
        operator.floordiv: lambda a, b: FloorDiv(a, b), operator.mod: lambda a, b: sympy.Mod(a, b),
        aten.sym_size.int: lambda t, d: t.shape[d], aten.sym_stride.int: lambda t, d: _stride(t, d),
        aten.sym_numel.default: lambda t: numel(t.shape),
    }
    for name, fn in (("sym_max", sympy.Max), ("sym_min", sympy.Min)):
        if hasattr(torch, name):
            ops[getattr(torch, name)] = fn
    if hasattr(torch, "sym_sum"):  # one argument: the terms (Dynamo of torch 2.11 emits it)
        ops[torch.sym_sum] = lambda terms: sum(terms, sympy.Integer(0))
    return ops


def _stride(t: Any, d: int) -> Size:
    raise NeedsNumber(f"a graph reads the stride of {t} along {d}")


_SIZE_OPS: dict | None = None


def size_call(target: Any, args: tuple, kwargs: dict) -> Size | None:
    """The value of an FX call on sizes (x.size(d), s0 * s1, ...) where it is one of the
    shape family's, else None. Calls that only take ints are left to the importer."""
    global _SIZE_OPS
    if _SIZE_OPS is None:
        _SIZE_OPS = _size_ops()
    fn = _SIZE_OPS.get(target) if not kwargs else None
    if fn is None:
        return None
    reads_tensor = target not in _ARITHMETIC_NAMES_CACHE() and args and hasattr(args[0], "shape")
    terms = [t for a in args for t in (a if isinstance(a, (list, tuple)) else (a,))]
    if not reads_tensor and not any(is_symbolic(t) for t in terms):
        return None
    value = fn(*args)
    return simplify(as_size(value)) if isinstance(value, (int, sympy.Basic)) else value


def _ARITHMETIC_NAMES_CACHE() -> set:  # noqa: N802 - a cached constant
    import operator

    return {operator.add, operator.sub, operator.mul, operator.neg, operator.floordiv, operator.mod}

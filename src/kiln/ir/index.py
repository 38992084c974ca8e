"""Integer index expressions: affine sums of symbols, floor-divisions and remainders.

Symbols are loop variables (with a known extent) or runtime values loaded from an index
tensor (extent unknown). Coefficients, constants, divisors and extents are sizes (ir/sizes.py):
ints, or expressions over a shape family's size symbols; a rewrite that needs a comparison
makes it only where the comparison holds for every size of the family. Expressions are kept
in a canonical form so that structurally equal indices compare equal, which is what fusion
uses to match a reduction's row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from kiln.ir import sizes
from kiln.ir.sizes import (
    Size,
    exact_div,
    is_symbolic,
    known_divides,
    known_eq,
    known_le,
    known_lt,
    simplify,
    smin,
)


@dataclass(frozen=True, order=True)
class Sym:
    name: str
    extent: Size | None = None  # values lie in [0, extent); None when unknown

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, order=True)
class FloorDiv:
    arg: Expr
    divisor: Size

    def __str__(self) -> str:
        return f"({_paren(self.arg)} // {self.divisor})"


@dataclass(frozen=True, order=True)
class Mod:
    arg: Expr
    divisor: Size

    def __str__(self) -> str:
        return f"({_paren(self.arg)} % {self.divisor})"


Atom = Union[Sym, FloorDiv, Mod]


def _paren(e: Expr) -> str:
    simple = len(e.terms) + (e.const != 0) <= 1 and all(c == 1 for _, c in e.terms)
    return str(e) if simple and not is_symbolic(e.const) else f"({e})"


def _atom_key(atom: Atom) -> str:
    return str(atom)


@dataclass(frozen=True)
class Expr:
    """sum(coef * atom) + const, terms sorted by their text, no zero coefficients."""

    terms: tuple[tuple[Atom, Size], ...] = ()
    const: Size = 0

    def __str__(self) -> str:
        parts = [(c, str(a) if _magnitude(c) == 1 else f"{_coef_str(_magnitude(c))} * {a}")
                 for a, c in self.terms]
        if self.const != 0 or not parts:
            parts.append((self.const, _coef_str(_magnitude(self.const))))
        text = ("-" if is_negative(parts[0][0]) else "") + parts[0][1]
        for c, p in parts[1:]:
            text += f" - {p}" if is_negative(c) else f" + {p}"
        return text

    # arithmetic -----------------------------------------------------------------
    def __add__(self, other: Expr | int) -> Expr:
        other = as_expr(other)
        return _make(list(self.terms) + list(other.terms), self.const + other.const)

    __radd__ = __add__

    def __sub__(self, other: Expr | int) -> Expr:
        return self + as_expr(other) * -1

    def __mul__(self, k: Size) -> Expr:
        if isinstance(k, bool) or not (isinstance(k, int) or _is_size_expr(k)):
            raise TypeError(f"index expressions scale by integers and sizes, not {type(k).__name__}")
        return _make([(a, c * k) for a, c in self.terms], simplify(self.const * k))

    __rmul__ = __mul__

    def __floordiv__(self, d: Size) -> Expr:
        return floordiv(self, d)

    def __mod__(self, d: Size) -> Expr:
        return mod(self, d)

    # queries ----------------------------------------------------------------------
    def symbols(self) -> set[Sym]:
        out: set[Sym] = set()
        for atom, _ in self.terms:
            if isinstance(atom, Sym):
                out.add(atom)
            else:
                out |= atom.arg.symbols()
        return out

    def nested_symbols(self) -> set[Sym]:
        """The symbols inside its floor-divisions and remainders."""
        return set().union(*(atom.arg.symbols() for atom, _ in self.terms if not isinstance(atom, Sym)))

    def coef(self, sym: Sym) -> Size:
        for atom, c in self.terms:
            if atom == sym:
                return c
        return 0

    def is_affine(self) -> bool:
        return all(isinstance(a, Sym) for a, _ in self.terms)

    def bounds(self) -> tuple[Size, Size] | None:
        """Inclusive [lo, hi] of the value, or None when a symbol is unbounded (or a
        coefficient's sign is not known for every size)."""
        lo = hi = self.const
        for atom, c in self.terms:
            b = atom_bounds(atom)
            if b is None:
                return None
            if is_negative(c):
                lo, hi = lo + b[1] * c, hi + b[0] * c
            elif known_le(0, c):
                lo, hi = lo + b[0] * c, hi + b[1] * c
            else:
                return None
        return simplify(lo), simplify(hi)


def is_negative(c: Size) -> bool:
    """c < 0 for every size (a coefficient's sign, as its text shows it)."""
    if isinstance(c, int):
        return c < 0
    return bool(c.could_extract_minus_sign()) and known_lt(c, 0)


def _magnitude(c: Size) -> Size:
    return -c if is_negative(c) else c


def _coef_str(c: Size) -> str:
    return str(c) if isinstance(c, int) or c.is_Symbol else f"({c})"


def atom_bounds(atom: Atom) -> tuple[Size, Size] | None:
    if isinstance(atom, Sym):
        if atom.extent is None:
            return None
        if isinstance(atom.extent, int):
            return 0, max(atom.extent - 1, 0)
        return 0, simplify(atom.extent - 1)
    if isinstance(atom, Mod):
        inner = atom.arg.bounds()
        if inner is not None and known_le(0, inner[0]):
            return 0, smin(simplify(atom.divisor - 1), inner[1])
        return None
    inner = atom.arg.bounds()
    if inner is None:
        return None
    if isinstance(atom.divisor, int) and isinstance(inner[0], int) and isinstance(inner[1], int):
        return inner[0] // atom.divisor, inner[1] // atom.divisor
    if known_le(0, inner[0]):  # non-negative: the quotient lies in [0, hi // d]
        return 0, simplify(sizes.sympy.floor(sizes.sympy.sympify(inner[1]) / atom.divisor))
    return None


def _is_size_expr(v: object) -> bool:
    return sizes._is_sympy(v) and isinstance(v, sizes.sympy.Expr)


def as_expr(v: Expr | Atom | Size) -> Expr:
    if isinstance(v, Expr):
        return v
    if isinstance(v, int) or _is_size_expr(v):
        return Expr((), simplify(v))
    return Expr(((v, 1),), 0)


def sym(name: str, extent: Size | None = None) -> Expr:
    return as_expr(Sym(name, extent))


def _make(terms: list[tuple[Atom, Size]], const: Size) -> Expr:
    merged: dict[Atom, Size] = {}
    for atom, c in terms:
        merged[atom] = simplify(merged.get(atom, 0) + c)
    # a symbol of extent 1 is always 0
    merged = {a: c for a, c in merged.items() if c != 0 and atom_bounds(a) != (0, 0)}
    while (hit := _find_split(merged)) is not None:
        const = const + _join(merged, *hit)
    ordered = tuple(sorted(merged.items(), key=lambda t: _atom_key(t[0])))
    return Expr(ordered, simplify(const))


def _find_split(terms: dict[Atom, Size]) -> tuple[Atom, Atom, Expr, Size] | None:
    """A pair of terms (e // d) * d*c and (e % d) * c, which sum to e * c: the split that a
    reshape introduces. The remainder may be in simplified form, e.g. ((x % 12) // 4) * 4 +
    x % 4 == x % 12. Returns (quotient atom, remainder atom, e, c)."""
    for atom, c in terms.items():  # remainder first: (e % d) * c with e // d a single atom
        if isinstance(atom, Mod):
            quotient = _floordiv(atom.arg, atom.divisor)
            if len(quotient.terms) == 1 and quotient.terms[0][1] == 1 and not quotient.const:
                partner = quotient.terms[0][0]
                if partner in terms and known_eq(terms[partner], c * atom.divisor):
                    return partner, atom, atom.arg, c
    for atom, k in terms.items():  # quotient first: (e // d) * d*c with e % d a single atom
        if isinstance(atom, FloorDiv) and known_divides(atom.divisor, k):
            c = exact_div(k, atom.divisor)
            rem = _mod(atom.arg, atom.divisor)
            if len(rem.terms) == 1 and not rem.const and rem.terms[0][1] == 1:
                partner = rem.terms[0][0]
                if partner != atom and partner in terms and known_eq(terms[partner], c):
                    return atom, partner, atom.arg, c
    return None


def _join(terms: dict[Atom, Size], quotient: Atom, remainder: Atom, e: Expr, c: Size) -> Size:
    """Replace the two terms by e * c in place; returns the constant that e * c adds."""
    del terms[quotient], terms[remainder]
    for a, k in e.terms:
        terms[a] = simplify(terms.get(a, 0) + k * c)
        if terms[a] == 0:
            del terms[a]
    return simplify(e.const * c)


def _split_const(const: Size, d: Size) -> tuple[Size, Size]:
    """const = base + rest with d dividing base and 0 <= rest < d where that is known;
    (0, const) where it is not."""
    if isinstance(const, int) and isinstance(d, int):
        return const - const % d, const % d
    if known_divides(d, const):
        return const, 0
    return 0, const


def _check_divisor(d: Size, what: str) -> None:
    if isinstance(d, int) and d <= 0 or not isinstance(d, int) and not known_lt(0, d):
        raise ValueError(f"{what} of an index by a number not known to be positive: {d}")


def floordiv(e: Expr, d: Size) -> Expr:
    _check_divisor(d, "floor division")
    return _floordiv(e, d)


def _floordiv(e: Expr, d: Size) -> Expr:
    """e // d for a divisor known positive (an atom's, checked when it was made: a kernel's
    renamed sizes carry none of the family's facts that proved it)."""
    d = simplify(d)
    if d == 1:
        return e
    exact = [(a, exact_div(c, d)) for a, c in e.terms if known_divides(d, c)]
    base_const, rest_const = _split_const(e.const, d)
    rest = Expr(tuple((a, c) for a, c in e.terms if not known_divides(d, c)), rest_const)
    base = exact_div(base_const, d)
    if not rest.terms:
        if isinstance(rest.const, int) and isinstance(d, int):
            return _make(exact, base + rest.const // d)
        if known_le(0, rest.const) and known_lt(rest.const, d):
            return _make(exact, base)
        return _make(exact + [(FloorDiv(rest, d), 1)], base) if known_le(0, rest.const) else \
            _make([(FloorDiv(e, d), 1)], 0)
    b = rest.bounds()
    if b is not None and known_le(0, b[0]) and known_lt(b[1], d):
        return _make(exact, base)
    if b is not None and known_le(0, b[0]) and len(rest.terms) == 1 and rest.const == 0:
        atom, c = rest.terms[0]
        if isinstance(atom, FloorDiv) and c == 1:  # (e // a) // b == e // (a * b)
            return _make(exact + [(FloorDiv(atom.arg, simplify(atom.divisor * d)), 1)], base)
    if exact or base_const != 0:
        # keep the split only when it cannot change the result: rest >= 0 then.
        if b is not None and known_le(0, b[0]):
            return _make(exact + [(FloorDiv(rest, d), 1)], base)
    return _make([(FloorDiv(e, d), 1)], 0)


def mod(e: Expr, d: Size) -> Expr:
    _check_divisor(d, "remainder")
    return _mod(e, d)


def _mod(e: Expr, d: Size) -> Expr:
    """e % d for a divisor known positive (see _floordiv)."""
    d = simplify(d)
    if d == 1:
        return Expr()
    e = _drop_inner_mods(e, d)
    _, rest_const = _split_const(e.const, d)
    rest = Expr(tuple((a, c) for a, c in e.terms if not known_divides(d, c)), rest_const)
    if not rest.terms and isinstance(rest.const, int) and isinstance(d, int):
        return Expr((), rest.const)
    b = rest.bounds()
    if b is not None and known_le(0, b[0]) and known_lt(b[1], d):
        return rest
    if b is not None and known_le(0, b[0]):
        return _make([(Mod(rest, d), 1)], 0)
    return _make([(Mod(e, d), 1)], 0)


def _drop_inner_mods(e: Expr, d: Size) -> Expr:
    """(x % (k * d)) % d == x % d: the inner remainder only removes multiples of d."""
    if not any(isinstance(a, Mod) and known_divides(d, a.divisor) for a, _ in e.terms):
        return e
    out = Expr((), e.const)
    for atom, c in e.terms:
        inner = atom.arg if isinstance(atom, Mod) and known_divides(d, atom.divisor) else as_expr(atom)
        out = out + inner * c
    return out


def substitute(e: Expr, mapping: dict[Sym, Expr]) -> Expr:
    """Replace symbols by expressions, re-simplifying on the way up."""
    out = Expr((), e.const)
    for atom, c in e.terms:
        if isinstance(atom, Sym):
            out = out + mapping.get(atom, as_expr(atom)) * c
        elif isinstance(atom, FloorDiv):
            out = out + _floordiv(substitute(atom.arg, mapping), atom.divisor) * c
        else:
            out = out + _mod(substitute(atom.arg, mapping), atom.divisor) * c
    return out

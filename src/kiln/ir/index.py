"""Integer index expressions: affine sums of symbols, floor-divisions and remainders.

Symbols are loop variables (with a known extent) or runtime values loaded from an index
tensor (extent unknown). Expressions are kept in a canonical form so that structurally
equal indices compare equal, which is what fusion uses to match a reduction's row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True, order=True)
class Sym:
    name: str
    extent: int | None = None  # values lie in [0, extent); None when unknown

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, order=True)
class FloorDiv:
    arg: Expr
    divisor: int

    def __str__(self) -> str:
        return f"({_paren(self.arg)} // {self.divisor})"


@dataclass(frozen=True, order=True)
class Mod:
    arg: Expr
    divisor: int

    def __str__(self) -> str:
        return f"({_paren(self.arg)} % {self.divisor})"


Atom = Union[Sym, FloorDiv, Mod]


def _paren(e: Expr) -> str:
    simple = len(e.terms) + (e.const != 0) <= 1 and all(c == 1 for _, c in e.terms)
    return str(e) if simple else f"({e})"


def _atom_key(atom: Atom) -> str:
    return str(atom)


@dataclass(frozen=True)
class Expr:
    """sum(coef * atom) + const, terms sorted by their text, no zero coefficients."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    def __str__(self) -> str:
        parts = [(c, str(a) if abs(c) == 1 else f"{abs(c)} * {a}") for a, c in self.terms]
        if self.const or not parts:
            parts.append((self.const, str(abs(self.const))))
        text = ("-" if parts[0][0] < 0 else "") + parts[0][1]
        for c, p in parts[1:]:
            text += f" - {p}" if c < 0 else f" + {p}"
        return text

    # arithmetic -----------------------------------------------------------------
    def __add__(self, other: Expr | int) -> Expr:
        other = as_expr(other)
        return _make(list(self.terms) + list(other.terms), self.const + other.const)

    __radd__ = __add__

    def __sub__(self, other: Expr | int) -> Expr:
        return self + as_expr(other) * -1

    def __mul__(self, k: int) -> Expr:
        if not isinstance(k, int):
            raise TypeError("index expressions scale by integers only")
        return _make([(a, c * k) for a, c in self.terms], self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, d: int) -> Expr:
        return floordiv(self, d)

    def __mod__(self, d: int) -> Expr:
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

    def coef(self, sym: Sym) -> int:
        for atom, c in self.terms:
            if atom == sym:
                return c
        return 0

    def is_affine(self) -> bool:
        return all(isinstance(a, Sym) for a, _ in self.terms)

    def bounds(self) -> tuple[int, int] | None:
        """Inclusive [lo, hi] of the value, or None when a symbol is unbounded."""
        lo = hi = self.const
        for atom, c in self.terms:
            b = atom_bounds(atom)
            if b is None:
                return None
            a, b_ = b[0] * c, b[1] * c
            lo += min(a, b_)
            hi += max(a, b_)
        return lo, hi


def atom_bounds(atom: Atom) -> tuple[int, int] | None:
    if isinstance(atom, Sym):
        return None if atom.extent is None else (0, max(atom.extent - 1, 0))
    if isinstance(atom, Mod):
        inner = atom.arg.bounds()
        if inner is not None and inner[0] >= 0:
            return 0, min(atom.divisor - 1, inner[1])
        return None
    inner = atom.arg.bounds()
    if inner is None:
        return None
    return inner[0] // atom.divisor, inner[1] // atom.divisor


def as_expr(v: Expr | Atom | int) -> Expr:
    if isinstance(v, Expr):
        return v
    if isinstance(v, int):
        return Expr((), v)
    return Expr(((v, 1),), 0)


def sym(name: str, extent: int | None = None) -> Expr:
    return as_expr(Sym(name, extent))


def _make(terms: list[tuple[Atom, int]], const: int) -> Expr:
    merged: dict[Atom, int] = {}
    for atom, c in terms:
        merged[atom] = merged.get(atom, 0) + c
    # a symbol of extent 1 is always 0
    merged = {a: c for a, c in merged.items() if c != 0 and atom_bounds(a) != (0, 0)}
    while (hit := _find_split(merged)) is not None:
        const += _join(merged, *hit)
    ordered = tuple(sorted(merged.items(), key=lambda t: _atom_key(t[0])))
    return Expr(ordered, const)


def _find_split(terms: dict[Atom, int]) -> tuple[Atom, Atom, Expr, int] | None:
    """A pair of terms (e // d) * d*c and (e % d) * c, which sum to e * c: the split that a
    reshape introduces. The remainder may be in simplified form, e.g. ((x % 12) // 4) * 4 +
    x % 4 == x % 12. Returns (quotient atom, remainder atom, e, c)."""
    for atom, c in terms.items():  # remainder first: (e % d) * c with e // d a single atom
        if isinstance(atom, Mod):
            quotient = floordiv(atom.arg, atom.divisor)
            if len(quotient.terms) == 1 and quotient.terms[0][1] == 1 and not quotient.const:
                partner = quotient.terms[0][0]
                if terms.get(partner) == c * atom.divisor:
                    return partner, atom, atom.arg, c
    for atom, k in terms.items():  # quotient first: (e // d) * d*c with e % d a single atom
        if isinstance(atom, FloorDiv) and k % atom.divisor == 0:
            c = k // atom.divisor
            rem = mod(atom.arg, atom.divisor)
            if len(rem.terms) == 1 and not rem.const and rem.terms[0][1] == 1:
                partner = rem.terms[0][0]
                if partner != atom and terms.get(partner) == c:
                    return atom, partner, atom.arg, c
    return None


def _join(terms: dict[Atom, int], quotient: Atom, remainder: Atom, e: Expr, c: int) -> int:
    """Replace the two terms by e * c in place; returns the constant that e * c adds."""
    del terms[quotient], terms[remainder]
    for a, k in e.terms:
        terms[a] = terms.get(a, 0) + k * c
        if terms[a] == 0:
            del terms[a]
    return e.const * c


def floordiv(e: Expr, d: int) -> Expr:
    if d <= 0:
        raise ValueError("floor division of an index by a non-positive number")
    if d == 1:
        return e
    exact = [(a, c // d) for a, c in e.terms if c % d == 0]
    rest = Expr(tuple((a, c) for a, c in e.terms if c % d != 0), e.const % d)
    base_const = e.const - e.const % d
    if not rest.terms:
        return _make(exact, base_const // d + rest.const // d)
    b = rest.bounds()
    if b is not None and 0 <= b[0] and b[1] < d:
        return _make(exact, base_const // d)
    if b is not None and b[0] >= 0 and len(rest.terms) == 1 and rest.const == 0:
        atom, c = rest.terms[0]
        if isinstance(atom, FloorDiv) and c == 1:  # (e // a) // b == e // (a * b)
            return _make(exact + [(FloorDiv(atom.arg, atom.divisor * d), 1)], base_const // d)
    if exact or base_const:
        # keep the split only when it cannot change the result: rest >= 0 then.
        if b is not None and b[0] >= 0:
            return _make(exact + [(FloorDiv(rest, d), 1)], base_const // d)
    return _make([(FloorDiv(e, d), 1)], 0)


def mod(e: Expr, d: int) -> Expr:
    if d <= 0:
        raise ValueError("remainder of an index by a non-positive number")
    if d == 1:
        return Expr()
    e = _drop_inner_mods(e, d)
    rest = Expr(tuple((a, c) for a, c in e.terms if c % d != 0), e.const % d)
    if not rest.terms:
        return Expr((), rest.const)
    b = rest.bounds()
    if b is not None and 0 <= b[0] and b[1] < d:
        return rest
    if b is not None and b[0] >= 0:
        return _make([(Mod(rest, d), 1)], 0)
    return _make([(Mod(e, d), 1)], 0)


def _drop_inner_mods(e: Expr, d: int) -> Expr:
    """(x % (k * d)) % d == x % d: the inner remainder only removes multiples of d."""
    if not any(isinstance(a, Mod) and a.divisor % d == 0 for a, _ in e.terms):
        return e
    out = Expr((), e.const)
    for atom, c in e.terms:
        inner = atom.arg if isinstance(atom, Mod) and atom.divisor % d == 0 else as_expr(atom)
        out = out + inner * c
    return out


def substitute(e: Expr, mapping: dict[Sym, Expr]) -> Expr:
    """Replace symbols by expressions, re-simplifying on the way up."""
    out = Expr((), e.const)
    for atom, c in e.terms:
        if isinstance(atom, Sym):
            out = out + mapping.get(atom, as_expr(atom)) * c
        elif isinstance(atom, FloorDiv):
            out = out + floordiv(substitute(atom.arg, mapping), atom.divisor) * c
        else:
            out = out + mod(substitute(atom.arg, mapping), atom.divisor) * c
    return out

"""Index expressions: canonical forms, floor-division and remainder rules, reshape
coalescing, substitution and printing. Every rewrite must keep the value for every point
of the domain, which the brute-force checks evaluate."""

from __future__ import annotations

import itertools
import random

import pytest

from kiln.ir import index as ix
from kiln.ir.index import Expr, FloorDiv, Mod, Sym, as_expr, floordiv, mod, substitute, sym


def evaluate(e: Expr, env: dict[str, int]) -> int:
    total = e.const
    for atom, c in e.terms:
        if isinstance(atom, Sym):
            v = env[atom.name]
        elif isinstance(atom, FloorDiv):
            v = evaluate(atom.arg, env) // atom.divisor
        else:
            v = evaluate(atom.arg, env) % atom.divisor
        total += c * v
    return total


def points(*syms: Sym):
    for values in itertools.product(*(range(s.extent) for s in syms)):
        yield {s.name: v for s, v in zip(syms, values)}


A, B, X = Sym("a", 4), Sym("b", 6), Sym("x", 24)
a, b, x = as_expr(A), as_expr(B), as_expr(X)
n = sym("n")  # unbounded (a value loaded at run time)


# -- canonical form ---------------------------------------------------------------------------


def test_terms_merge_and_cancel():
    assert a + a == a * 2
    assert a - a == as_expr(0)
    assert (a + b) - b == a
    assert (a + 3) + (b - 3) == a + b


def test_terms_are_ordered_so_equal_sums_compare_equal():
    assert a + b == b + a
    assert hash(a * 2 + b) == hash(b + 2 * a)


def test_symbol_of_extent_one_is_zero():
    assert sym("z", 1) * 5 + 2 == as_expr(2)


def test_scaling_by_a_non_integer_is_an_error():
    with pytest.raises(TypeError):
        a * 1.5


def test_bounds():
    assert (a * 6 + b).bounds() == (0, 23)
    assert (a - b).bounds() == (-5, 3)
    assert floordiv(x, 5).bounds() == (0, 4)
    assert mod(n, 4).bounds() is None  # n may be negative: the remainder's range is unknown
    assert (n + 1).bounds() is None


# -- floor division and remainder -------------------------------------------------------------


def test_division_by_one_and_of_constants():
    assert floordiv(a, 1) == a
    assert mod(a, 1) == as_expr(0)
    assert floordiv(as_expr(17), 5) == as_expr(3)
    assert mod(as_expr(-7), 5) == as_expr(3)  # floor semantics, as Python and PyTorch index math


def test_division_of_a_term_smaller_than_the_divisor():
    assert floordiv(b, 6) == as_expr(0)
    assert mod(b, 6) == b
    assert floordiv(a * 6 + b, 6) == a
    assert mod(a * 6 + b, 6) == b


def test_exact_multiples_leave_the_division():
    assert floordiv(n * 8 + 3, 4) == n * 2
    assert mod(n * 8 + 3, 4) == as_expr(3)
    assert floordiv(n * 8 + a, 4) == n * 2  # 0 <= a < 4


def test_nested_floor_divisions_combine():
    assert floordiv(floordiv(x, 2), 3) == floordiv(x, 6)
    assert str(floordiv(floordiv(x, 2), 3)) == "(x // 6)"


def test_remainder_of_a_remainder_by_a_divisor_of_it():
    assert mod(mod(x, 12), 6) == mod(x, 6)
    assert mod(mod(n, 12), 4) == mod(n, 4)
    assert mod(mod(x, 12), 5) != mod(x, 5)  # 5 does not divide 12: no rewrite
    assert isinstance(mod(mod(x, 12), 5).terms[0][0].arg.terms[0][0], Mod)


def test_non_positive_divisor_is_an_error():
    with pytest.raises(ValueError):
        floordiv(a, 0)
    with pytest.raises(ValueError):
        mod(a, -2)


def test_negative_offsets_keep_floor_semantics():
    e = floordiv(x - 1, 4)
    for env in points(X):
        assert evaluate(e, env) == (env["x"] - 1) // 4
    r = mod(x - 1, 4)
    for env in points(X):
        assert evaluate(r, env) == (env["x"] - 1) % 4


# -- reshape split / merge coalescing ---------------------------------------------------------


def test_split_then_merge_is_the_identity():
    # viewing [24] as [4, 6] then back: x -> (x // 6, x % 6) -> 6 * (x // 6) + x % 6
    assert floordiv(x, 6) * 6 + mod(x, 6) == x
    assert floordiv(a * 6 + b, 6) * 6 + mod(a * 6 + b, 6) == a * 6 + b


def test_coalescing_keeps_the_constant_of_the_split_expression():
    assert floordiv(x + 3, 4) * 4 + mod(x + 3, 4) == x + 3
    assert floordiv(x - 1, 4) * 4 + mod(x - 1, 4) == x - 1


def test_coalescing_scales_with_the_outer_stride():
    # a split read from a buffer with stride 2 along the merged dimension
    assert floordiv(x, 6) * 12 + mod(x, 6) * 2 == x * 2


def test_coalescing_through_an_inner_remainder():
    # [24] -> [2, 3, 4] -> merge the last two: 4 * ((x % 12) // 4) + x % 4 == x % 12
    assert floordiv(mod(x, 12), 4) * 4 + mod(x, 4) == mod(x, 12)


def test_no_coalescing_when_the_coefficients_do_not_match():
    e = floordiv(x, 6) * 5 + mod(x, 6)
    assert len(e.terms) == 2
    for env in points(X):
        assert evaluate(e, env) == env["x"] // 6 * 5 + env["x"] % 6


def _evaluate_built(rng_seed: int):
    """Build the same random expression twice: once simplified, once as a Python function."""
    rng = random.Random(rng_seed)

    def build(depth):
        const = rng.randint(-3, 3)
        chosen = rng.sample(["a", "b", "x"], rng.randint(1, 3))
        coefs = [rng.choice([1, 1, 2, 3, 6, -1]) for _ in chosen]
        e = as_expr(const)
        for name, c in zip(chosen, coefs):
            e = e + as_expr({"a": A, "b": B, "x": X}[name]) * c

        def f(env, const=const, chosen=chosen, coefs=coefs):
            return const + sum(env[nm] * c for nm, c in zip(chosen, coefs))

        if depth:
            inner, g = build(depth - 1)
            use_div, d, k = rng.random() < 0.5, rng.choice([2, 3, 4, 6, 12]), rng.choice([1, 2, 4, 6])
            e = e + (floordiv(inner, d) if use_div else mod(inner, d)) * k

            def f(env, f0=f, g=g, use_div=use_div, d=d, k=k):  # noqa: F811
                v = g(env)
                return f0(env) + k * (v // d if use_div else v % d)

        return e, f

    return build(2)


@pytest.mark.parametrize("seed", range(40))
def test_random_expressions_keep_their_value(seed):
    e, f = _evaluate_built(seed)
    for env in points(A, B, Sym("x", 5)):
        assert evaluate(e, env) == f(env), (str(e), env)


# -- substitution -----------------------------------------------------------------------------


def test_substitute_re_simplifies():
    # x = 6a + b: x // 6 == a and x % 6 == b
    assert substitute(floordiv(x, 6), {X: a * 6 + b}) == a
    assert substitute(mod(x, 6), {X: a * 6 + b}) == b
    assert substitute(floordiv(x, 6) * 6 + mod(x, 6), {X: a * 6 + b}) == a * 6 + b


def test_substitute_leaves_other_symbols_and_constants():
    e = a * 3 + b + 7
    assert substitute(e, {X: a}) == e
    assert substitute(e, {A: as_expr(2)}) == b + 13


def test_symbols_and_coefficients():
    e = a * 3 + floordiv(x, 4)
    assert e.symbols() == {A, X}
    assert e.coef(A) == 3 and e.coef(B) == 0
    assert not e.is_affine() and (a + b).is_affine()


# -- printing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, text",
    [
        (as_expr(0), "0"),
        (as_expr(-4), "-4"),
        (a, "a"),
        (a * 2 - b + 3, "2 * a - b + 3"),
        (b * -1, "-b"),
        (b * -2 - 1, "-2 * b - 1"),
        (a - 5, "a - 5"),
        (floordiv(x, 6), "(x // 6)"),
        (mod(x + 1, 6), "((x + 1) % 6)"),
        (floordiv(x, 6) * 4 + mod(x, 6), "(x % 6) + 4 * (x // 6)"),  # terms sorted by their text
    ],
)
def test_printing(expr, text):
    assert str(expr) == text


def test_printing_is_independent_of_construction_order():
    assert str(b + a * 2 + mod(x, 5)) == str(mod(x, 5) + a * 2 + b)


def test_module_helpers():
    assert ix.atom_bounds(Sym("q")) is None
    assert ix.atom_bounds(Mod(as_expr(X), 5)) == (0, 4)

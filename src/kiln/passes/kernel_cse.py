"""Common subexpressions of a kernel's statements, computed once per stage.

The emitter memoizes a value by its tensor-IR node and index, so a value read through two
gathers of the same index tensor is built twice: each gather normalizes and checks its
index again (a causal mask that compares two gathered positions: four copies of one index's
wrap, bounds check and error flag). Within a stage, a statement equal to an earlier one
after renaming (same function of the same values) is dropped and its uses take the earlier
value; a check equal to an earlier one on the same value is reported once. Stages are loops
of their own, so nothing is shared across them, except where one tile holds the whole row
(merge_across_stages, for a code generator's persistent rows).
"""

from __future__ import annotations

import dataclasses

from kiln.ir import kernel as k
from kiln.ir.index import Expr, Sym, as_expr, substitute


def merge_common_values(stages: tuple[k.Stage, ...], checks: tuple) -> tuple[tuple[k.Stage, ...], tuple]:
    """stages with each stage's repeated statements merged, and the check sites their flags
    still report, renumbered in order. checks: the kernel's check sites (a flag is dropped
    only where an earlier one reports the same check)."""
    written = {s.buf for st in stages for s in st.body if isinstance(s, k.Store)}
    stages = tuple(k.Stage(st.loop, _merged(st.body, written, checks)) for st in stages)
    sites = {s.site: None for st in stages for s in st.body if isinstance(s, k.Flag)}
    renumber = {old: new for new, old in enumerate(sites)}
    stages = tuple(k.Stage(st.loop, tuple(_resited(s, renumber) for s in st.body)) for st in stages)
    return stages, tuple(checks[old] for old in sites)


def _merged(body: tuple[k.Stmt, ...], written: set[str], checks: tuple) -> tuple[k.Stmt, ...]:
    kept = _without_repeats([(s, None) for s in body], lambda s: _key(s, written, checks))
    return tuple(s for s, _ in kept)


def merge_across_stages(stages: tuple[k.Stage, ...], unmerged: set[str]) -> list[tuple[k.Stmt, bool]]:
    """Each statement with its stage's loop flag, a statement equal to an earlier one of a stage
    with the same flag dropped: for rows held whole in one tile, where the stages share one
    scope (a LayerNorm's mean, variance and output stages then load the row once). unmerged:
    values never merged (a cast whose rounding is left to its store); flags are never merged."""
    written = {s.buf for st in stages for s in st.body if isinstance(s, k.Store)}

    def key(s: k.Stmt) -> tuple | None:
        if isinstance(s, k.Flag) or getattr(s, "out", None) in unmerged:
            return None
        return _key(s, written, ())

    return _without_repeats([(s, st.loop) for st in stages for s in st.body], key)


def _without_repeats(items: list[tuple[k.Stmt, object]], key_of) -> list[tuple[k.Stmt, object]]:
    """(statement, tag) pairs without a statement equal (by key_of, None: never) to an earlier
    one of the same tag; later uses of a dropped value take the earlier one's."""
    rename: dict[str, str] = {}
    first: dict[tuple, str] = {}
    out: list[tuple[k.Stmt, object]] = []
    for s, tag in items:
        s = _renamed(s, rename)
        key = key_of(s)
        if key is not None and (tag, key) in first:
            if not isinstance(s, k.Flag):
                rename[s.out] = first[tag, key]
            continue
        if key is not None:
            first[tag, key] = getattr(s, "out", "")
        out.append((s, tag))
    return out


def _resited(s: k.Stmt, renumber: dict[int, int]) -> k.Stmt:
    return dataclasses.replace(s, site=renumber[s.site]) if isinstance(s, k.Flag) else s


def _key(s: k.Stmt, written: set[str], checks: tuple) -> tuple | None:
    """What makes two statements compute the same value; None: never merged (reductions,
    stores, loads of a buffer the kernel writes)."""
    if isinstance(s, k.Const):  # by text: 0.0 and -0.0, or 1 and True, compare equal
        return ("const", type(s.value).__name__, repr(s.value), s.dtype)
    if isinstance(s, k.Compute):
        return ("compute", s.fn, s.args, s.dtype)
    if isinstance(s, k.IndexValue):
        return ("index", s.index)
    if isinstance(s, k.InBounds):
        return ("in bounds", s.index, s.size)
    if isinstance(s, k.Load) and s.buf not in written:
        return ("load", s.buf, s.index, s.dtype, s.mask)
    if isinstance(s, k.Flag):
        return ("flag", s.cond, s.value, checks[s.site])
    return None


def _renamed(s: k.Stmt, rename: dict[str, str]) -> k.Stmt:
    if not rename:
        return s
    name = lambda v: rename.get(v, v)  # noqa: E731
    changes: dict = {}
    if isinstance(s, k.Compute):
        changes["args"] = tuple(map(name, s.args))
    elif isinstance(s, k.Reduce):
        changes["value"] = name(s.value)
    elif isinstance(s, k.Store):
        changes["value"] = name(s.value)
    elif isinstance(s, k.Flag):
        changes.update(cond=name(s.cond), value=name(s.value))
    if isinstance(s, k.Load) and s.mask is not None:
        changes["mask"] = name(s.mask)
    index = getattr(s, "index", None)
    if isinstance(index, Expr):
        changes["index"] = _renamed_index(index, rename)
    return dataclasses.replace(s, **changes) if changes else s


def _renamed_index(e: Expr, rename: dict[str, str]) -> Expr:
    mapping = {sym: as_expr(Sym(rename[sym.name], sym.extent)) for sym in e.symbols() if sym.name in rename}
    return substitute(e, mapping) if mapping else e

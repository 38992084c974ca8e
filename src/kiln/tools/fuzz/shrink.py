"""Shrink a failing program: fewer outputs, statements and inputs, smaller and plainer
inputs, for as long as the program still runs in eager and still fails the same way."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from kiln.tools.fuzz.grammar import check_eager
from kiln.tools.fuzz.program import InputSpec, Program, Stmt


def shrink(program: Program, still_fails: Callable[[Program], bool], budget_s: float = 60.0) -> Program:
    """The smallest variant found within budget_s that still_fails (greedy, first fit)."""
    deadline = time.time() + budget_s
    best = prune(program)
    if best != program and not (_valid(best) and still_fails(best)):
        best = program
    improved = True
    while improved and time.time() < deadline:
        improved = False
        for candidate in _candidates(best):
            if time.time() > deadline:
                break
            candidate = prune(candidate)
            if candidate != best and _valid(candidate) and still_fails(candidate):
                best, improved = candidate, True
                break
    return best


def _valid(program: Program) -> bool:
    if not program.stmts or not program.outputs:
        return False
    try:
        check_eager(program)
        return True
    except Exception:  # noqa: BLE001 - eager rejects the variant
        return False


def prune(program: Program) -> Program:
    """Drop statements no output needs (updates in place stay) and inputs nothing uses."""
    live = set(program.outputs)
    kept: list[Stmt] = []
    for stmt in reversed(program.stmts):
        if stmt.target in live or not stmt.target:
            kept.append(stmt)
            live.update(stmt.args)
    kept.reverse()
    inputs = tuple(s for s in program.inputs if s.name in live)
    return replace(program, stmts=tuple(kept), inputs=inputs)


def _candidates(p: Program) -> Iterator[Program]:
    if len(p.outputs) > 1:
        for out in p.outputs:
            yield replace(p, outputs=(out,))
    for k in reversed(range(len(p.stmts))):
        yield replace(p, stmts=p.stmts[:k] + p.stmts[k + 1 :])
        stmt = p.stmts[k]
        if stmt.target:
            yield from _bypass(p, k)
    if p.grad:
        yield replace(p, grad=False, inputs=tuple(replace(s, grad=False) for s in p.inputs))
    for k, spec in enumerate(p.inputs):
        for simpler in _simpler_inputs(spec):
            yield replace(p, inputs=p.inputs[:k] + (simpler,) + p.inputs[k + 1 :])


def _bypass(p: Program, k: int) -> Iterator[Program]:
    """Statement k removed, its value replaced by one of its arguments."""
    stmt = p.stmts[k]
    names = {s.name for s in p.inputs} | {s.target for s in p.stmts[:k] if s.target}
    for arg in dict.fromkeys(a for a in stmt.args if a in names):
        rename = {stmt.target: arg}
        later = tuple(replace(s, args=tuple(rename.get(n, n) for n in s.args)) for s in p.stmts[k + 1 :])
        outputs = tuple(dict.fromkeys(rename.get(n, n) for n in p.outputs))
        yield replace(p, stmts=p.stmts[:k] + later, outputs=outputs)


def _simpler_inputs(spec: InputSpec) -> Iterator[InputSpec]:
    if spec.special_at:
        yield replace(spec, special_at=())
        if len(spec.special_at) > 1:
            for k in range(len(spec.special_at)):
                yield replace(spec, special_at=spec.special_at[k : k + 1])
    if spec.layout != "contiguous":
        yield replace(spec, layout="contiguous", expand_dims=())
    if spec.kind != "value":
        return  # an index's shape and range are tied to the value it indexes
    for d, size in enumerate(spec.shape):
        for smaller in dict.fromkeys((1, size // 2)):
            if 0 < smaller < size:
                shape = spec.shape[:d] + (smaller,) + spec.shape[d + 1 :]
                yield replace(spec, shape=shape, expand_dims=tuple(e for e in spec.expand_dims if e != d))

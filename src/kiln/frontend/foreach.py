"""Decompositions of the `_foreach_*` ops (an optimizer's step over all its tensors at once)
into the element-wise op they apply to each tensor: `_foreach_X(a, b)[i] == X(a[i], b[i])`.

Each tensor's ops then fuse into one kernel per tensor, and the kernels that write the
parameters and states write them in place (passes/in_place.py). An overload whose per-tensor
op has no overload of the same argument types (a per-tensor scalar given as a tensor) is left
to ATen.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

aten = torch.ops.aten

# the element-wise ops optimizers apply through foreach calls
_ELEMENTWISE = (
    "abs add addcdiv addcmul clamp_max clamp_min div exp lerp log maximum minimum mul neg pow "
    "reciprocal sigmoid sign sqrt sub"
).split()

_ELEMENT = {"List[Tensor]": "Tensor", "List[number]": "number"}


def _per_tensor_overload(op: torch._ops.OpOverload) -> tuple[Any, list[bool]] | None:
    """The overload of the per-tensor op taking the elements of op's arguments, and for each
    argument whether it is a list (zipped) or one value (passed to every call)."""
    args = op._schema.arguments
    if [str(r.type) for r in op._schema.returns] != ["List[Tensor]"]:
        return None
    types = [_ELEMENT.get(str(a.type), str(a.type)) for a in args]
    packet = getattr(aten, op._schema.name.split("::")[1][len("_foreach_"):], None)
    if packet is None:
        return None
    for name in packet.overloads():
        base = getattr(packet, name)
        params = base._schema.arguments
        if [str(r.type) for r in base._schema.returns] != ["Tensor"] or len(params) < len(args):
            continue
        if [str(p.type) for p in params[:len(args)]] != types:
            continue
        if any(not p.has_default_value() for p in params[len(args):]):
            continue
        return base, [str(a.type) in _ELEMENT for a in args]
    return None


def _decomposition(op: torch._ops.OpOverload) -> Callable | None:
    found = _per_tensor_overload(op)
    if found is None:
        return None
    base, zipped = found
    names = [a.name for a in op._schema.arguments]
    keyword_only = [p.kwarg_only for p in base._schema.arguments[:len(names)]]
    base_names = [p.name for p in base._schema.arguments[:len(names)]]

    def per_tensor(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        values = list(args) + [kwargs[n] if n in kwargs else _default(op, n) for n in names[len(args):]]
        count = len(next(v for v, z in zip(values, zipped) if z))
        results = []
        for i in range(count):
            items = [v[i] if z else v for v, z in zip(values, zipped)]
            positional = [v for v, kw in zip(items, keyword_only) if not kw]
            keywords = {n: v for n, v, kw in zip(base_names, items, keyword_only) if kw}
            results.append(base(*positional, **keywords))
        return results

    return per_tensor


def _default(op: torch._ops.OpOverload, name: str) -> Any:
    return next(a.default_value for a in op._schema.arguments if a.name == name)


@functools.cache
def foreach_decompositions() -> dict:
    table = {}
    for fn in _ELEMENTWISE:
        packet = getattr(aten, f"_foreach_{fn}", None)
        for name in packet.overloads() if packet is not None else ():
            op = getattr(packet, name)
            decomposition = _decomposition(op)
            if decomposition is not None:
                table[op] = decomposition
    return table
